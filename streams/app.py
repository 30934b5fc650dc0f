"""The streams worker: the approval-join as a faust app (its changelog-backed table is why
faust is here), and the stateless stages, validator and authorizer, on the runtime's
consumer loop in the same process (streams/stateless.py).

Both are at-least-once: outputs are acknowledged before offsets are committed, and every
stage is idempotent by `call_id`, so a redelivered record is harmless.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

import faust
from aiokafka.errors import KafkaError
from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT as Credentials

from approvals.http import install_approval_api
from approvals.inbox import ApprovalInbox
from commands.catalog import Catalog
from commands.freezes import FleetFreezes
from commands.policy_feed import PolicyFeed
from commands.validate import Limits
from runtime.clients import (
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    database_conninfo,
    fetch_bytes,
    kafka_ssl_context,
    token_provider,
)
from runtime.health import Health
from runtime.retry import retrying
from schemas.errors import ConfigurationError
from schemas.identity import context_keys
from schemas.names import STREAMS_APP_ID, Topic
from schemas.settings import KafkaConnection, Settings
from schemas.vocabulary import StreamStage
from streams.approval_join import install_approval_join
from streams.faust_patches import install_faust_patches
from streams.observe import StageObserver
from streams.publisher import StagePublisher, stage_replies
from streams.stateless import StatelessStages
from streams.storage import StreamStorage
from telemetry.metrics import metrics_body, refresh_consumer_lag
from telemetry.tracing import tracer_from

log = logging.getLogger("ratifier.streams")

# How the benchmark's faust identity hop batches (bench/faust_identity.py, the T1 baseline).
BATCH_MAX = 500
BATCH_WITHIN = 0.005  # seconds a partial batch waits for more records
STAGES = frozenset(StreamStage)
LAG_REFRESH_SECONDS = 5.0


def limits_from(settings: Settings) -> Limits:
    return Limits(
        max_record_bytes=settings.limits.max_record_bytes,
        max_nesting_depth=settings.limits.max_nesting_depth,
        max_string_length=settings.limits.max_string_length,
        reply_namespace=settings.reply_namespace,
    )


def broker_credentials(connection: KafkaConnection) -> Credentials | None:
    """Faust's form of ``connection``'s security (its aiokafka driver turns it back into the
    same ``security_protocol`` / ``ssl_context`` / ``sasl_*`` options as runtime/clients.py)."""
    context = kafka_ssl_context(connection)
    if connection.security_protocol == "SSL":
        return SSLCredentials(context)
    if not connection.uses_sasl:
        return None
    if connection.sasl_mechanism == "OAUTHBEARER":
        return OAuthCredentials(oauth_cb=token_provider(connection), ssl_context=context)
    return SASLCredentials(
        username=connection.sasl_username,
        password=connection.sasl_password.get_secret_value()
        if connection.sasl_password is not None
        else None,
        ssl_context=context,
        mechanism=connection.sasl_mechanism,
    )


def faust_settings(settings: Settings) -> dict[str, Any]:
    """The broker, serialization and producer settings of every faust app (the stages' and
    the benchmark's faust baseline, which must match them)."""
    # faust takes `host:port;host:port` (or a comma list) after its scheme.
    return {
        "broker": f"kafka://{settings.kafka.bootstrap}",
        "broker_credentials": broker_credentials(settings.kafka),
        "store": "memory://",
        "key_serializer": "raw",
        "value_serializer": "raw",
        "topic_partitions": settings.topic_partitions,
        "topic_replication_factor": 1,
        "consumer_auto_offset_reset": "earliest",
        "producer_acks": -1,
        # A few ms of linger lets the producer batch; without it every record is a request.
        "producer_linger": 0.003,
        # Any record a topic accepts can be fetched, and answered (docs/reliability.md).
        "producer_max_request_size": settings.limits.kafka_max_message_bytes,
        "consumer_max_fetch_size": fetch_bytes(settings),
        # A restarted or crashed worker's partitions move after 6 s like the executors',
        # not after faust's default 60 s session timeout (validation, authorization and
        # approvals stood still that long after any worker crash).
        "broker_session_timeout": SESSION_TIMEOUT_MS / 1000,
        "broker_heartbeat_interval": HEARTBEAT_INTERVAL_MS / 1000,
    }


def create_app(
    settings: Settings, *, catalog: Catalog, feed: PolicyFeed, **faust_options: Any
) -> faust.App:
    """A faust app with the validator, authorizer and approval-join agents."""
    install_faust_patches()
    app = faust.App(
        settings.group(STREAMS_APP_ID),
        **faust_settings(settings),
        # Approval state is recovered from the changelog by the partition's new owner; no
        # standby copies, so a worker's timer only ever sees partitions it owns.
        table_standby_replicas=0,
        web_enabled=settings.streams.http_port > 0,
        web_port=settings.streams.http_port or 6066,
        web_bind=settings.observability.metrics_host,
        **faust_options,
    )
    limits = limits_from(settings)
    keys = context_keys(settings)
    storage = StreamStorage(database_conninfo(settings))
    topics = {
        t: app.topic(settings.topic(t), key_type=bytes, value_type=bytes, internal=False)
        for t in Topic
    }

    health = Health.of("streams", settings)
    observer = StageObserver(tracer_from(settings, service="streams"))
    replies, reply_producer = stage_replies(settings)
    publisher = StagePublisher(topics, replies=replies)

    stages = settings.streams.stages
    unknown = stages - STAGES
    if unknown:
        raise ConfigurationError(
            f"unknown stream stages {sorted(unknown)}; known: {sorted(STAGES)}"
        )
    # The kill switch (commands/freezes.py): the stages admit calls once the view is caught up.
    freezes = FleetFreezes(settings)
    freezes_ready = asyncio.Event()
    stateless = StatelessStages(
        settings,
        stages=stages,
        catalog=catalog,
        feed=feed,
        keys=keys,
        limits=limits,
        fetch_many=storage.fetch_many,
        tracer=observer.tracer,
        freezes=freezes,
    )

    async def follow_freezes() -> None:
        await retrying(
            partial(freezes.follow, freezes_ready), retry_on=(KafkaError, OSError), what="controls"
        )

    app.task(follow_freezes)

    async def run_stateless_stages() -> None:
        await freezes_ready.wait()
        await stateless.run()

    app.task(run_stateless_stages)

    async def follow_policies() -> None:
        await feed.follow()

    app.task(follow_policies)

    @app.timer(interval=LAG_REFRESH_SECONDS)  # type: ignore[untyped-decorator]  # faust's is untyped
    async def refresh_lag() -> None:
        await refresh_consumer_lag(app.consumer, settings.group(STREAMS_APP_ID))
        # Health: faust fetches in its own service; this timer turning is the worker's loop
        # turning, and the consumer's assignment and lag are read as the executor's are.
        if app.rebalancing:
            health.waiting_for("rebalancing")
        else:
            health.running()
            health.polled()
            await health.observe(app.consumer)

    del refresh_lag  # registered with the app

    if settings.streams.http_port > 0:
        inbox = ApprovalInbox(settings)
        install_approval_api(app, settings, inbox=inbox, keys=keys)

        @app.page("/healthz")
        async def healthz(view: Any, _request: Any) -> Any:
            alive, body = health.liveness()
            return view.json(body, status=200 if alive else 503)

        @app.page("/readyz")
        async def readyz(view: Any, _request: Any) -> Any:
            ready, body = health.readiness()
            return view.json(body, status=200 if ready else 503)

        del healthz, readyz  # registered with the app

        @app.page("/metrics")
        async def metrics(view: Any, _request: Any) -> Any:
            body, content_type = metrics_body()
            return view.bytes(body, headers={"Content-Type": content_type})

        del metrics  # registered with the app

        async def _close_inbox(_app: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
            await inbox.close()

        app.on_before_shutdown.connect(_close_inbox)
    if StreamStage.APPROVAL_JOIN in stages:
        install_approval_join(
            app,
            settings,
            topics=topics,
            catalog=catalog,
            feed=feed,
            storage=storage,
            keys=keys,
            limits=limits,
            publish=publisher.publish,
            observer=observer,
            freezes=freezes,
        )

    async def _close_store(_app: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        await stateless.stopped(grace_seconds=10.0)
        await storage.close()
        await reply_producer.stop()
        observer.tracer.shutdown()

    app.on_before_shutdown.connect(_close_store)

    return app
