"""The faust app: wires the pure stages to topics. All I/O of the stream side lives here.

Faust gives at-least-once delivery: it flushes the producer before committing offsets, and
every stage is idempotent by `call_id`, so a redelivered record is harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

import faust
from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT as Credentials
from pydantic import ValidationError

from approvals.http import install_approval_api
from approvals.inbox import ApprovalInbox
from commands.catalog import Catalog
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
from runtime.loop import text_key
from runtime.retry import retrying
from schemas.envelopes import Stage, ValidatedCall
from schemas.errors import ConfigurationError, StorageUnavailable
from schemas.identity import context_keys
from schemas.names import STREAMS_APP_ID, Topic
from schemas.settings import KafkaConnection, Settings
from streams.approval_join import install_approval_join
from streams.authorizer import on_validated_batch
from streams.emit import Emit
from streams.observe import StageObserver
from streams.offsets import install_rewind_fix
from streams.publisher import StagePublisher, position, stage_replies
from streams.storage import StreamStorage
from streams.validator import dead_letter, on_proposed
from telemetry.metrics import metrics_body, refresh_consumer_lag
from telemetry.tracing import trace_id_of, traceparent_of, tracer_from

log = logging.getLogger("ratifier.streams")

BATCH_MAX = 500
BATCH_WITHIN = 0.005  # seconds a partial batch waits for more records
STAGES = frozenset({"validator", "authorizer", "approval-join"})
LAG_REFRESH_SECONDS = 5.0
# Metric and span names of the stages (the `stage` of their outcomes).
STAGE_NAMES = {"validator": Stage.VALIDATE, "authorizer": Stage.AUTHORIZE}


def limits_from(settings: Settings) -> Limits:
    return Limits(
        max_record_bytes=settings.max_record_bytes,
        max_nesting_depth=settings.max_nesting_depth,
        max_string_length=settings.max_string_length,
        reply_namespace=settings.reply_namespace,
    )


BatchHandler = Callable[[Sequence[Any]], Awaitable[list[tuple[Emit, ...]]]]


async def with_storage_retry(
    step: Callable[[], Awaitable[list[tuple[Emit, ...]]]],
) -> list[tuple[Emit, ...]]:
    """Retry a stage while storage is unreachable: the record waits, it is never dropped."""
    return await retrying(step, retry_on=(StorageUnavailable,), what="stage storage")


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
        "producer_max_request_size": settings.kafka_max_message_bytes,
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
    install_rewind_fix()
    app = faust.App(
        settings.group(STREAMS_APP_ID),
        **faust_settings(settings),
        # Approval state is recovered from the changelog by the partition's new owner; no
        # standby copies, so a worker's timer only ever sees partitions it owns.
        table_standby_replicas=0,
        web_enabled=settings.http_port > 0,
        web_port=settings.http_port or 6066,
        web_bind=settings.metrics_host,
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

    def unreadable(event: Any, stage: str, why: str) -> tuple[Emit, ...]:
        return (
            dead_letter(
                event.value,
                reason=f"{stage}: {why}",
                call_id=None,
                source=position(event),
                at=datetime.now(UTC),
                key=text_key(event.key),
            ),
        )

    async def run_stage(stream: Any, stage: str, handle: BatchHandler) -> None:
        """Feed the stream to ``handle`` in batches (a backlog drains in large batches, a
        quiet stream waits at most BATCH_WITHIN). A bug in a stage costs only the record
        that triggers it: the batch is retried one record at a time and that record is
        dead-lettered; an output that cannot be published costs only its own record too
        (streams/publisher.py), and a broker away is waited out. Nothing may escape this
        loop: faust acks the events of a batch only as the loop moves on, and an agent that
        crashed mid-batch leaves offsets never acked, after which faust commits nothing more
        on that partition (docs/reliability.md, "Offsets of the stream stages")."""
        name = STAGE_NAMES[stage]
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN):
            started = time.time_ns()
            try:
                results = await with_storage_retry(partial(handle, events))
                if len(results) != len(events):
                    raise RuntimeError(f"{stage} answered {len(results)} of {len(events)}")
            except Exception:
                log.exception("%s: batch failed; retrying record by record", stage)
                results = []
                for event in events:
                    try:
                        results.extend(await with_storage_retry(partial(handle, [event])))
                    except Exception:
                        log.exception("%s: internal error at %s", stage, position(event))
                        results.append(unreadable(event, stage, "internal error"))
            ended = time.time_ns()
            await publisher.publish_all(
                name,
                [
                    (
                        event,
                        emits,
                        observer.finished(
                            name,
                            emits,
                            parent=traceparent_of(event.message.headers),
                            start_ns=started,
                            end_ns=ended,
                        ),
                    )
                    for event, emits in zip(events, results, strict=True)
                ],
            )

    stages = settings.stream_stages
    unknown = stages - STAGES
    if unknown:
        raise ConfigurationError(
            f"unknown stream stages {sorted(unknown)}; known: {sorted(STAGES)}"
        )

    async def validate_batch(events: Sequence[Any]) -> list[tuple[Emit, ...]]:
        now = datetime.now(UTC)
        return [
            on_proposed(
                event.value,
                source=position(event),
                key=text_key(event.key),
                catalog=catalog,
                limits=limits,
                now=now,
                trace_id=trace_id_of(event.message.headers),
                policy_version=feed.current.version,
            )
            for event in events
        ]

    async def authorize_events(events: Sequence[Any]) -> list[tuple[Emit, ...]]:
        parsed: list[ValidatedCall | None] = []
        for event in events:
            try:
                parsed.append(ValidatedCall.model_validate_json(event.value or b""))
            except ValidationError:
                parsed.append(None)
        calls = [c for c in parsed if c is not None]
        decided = iter(
            await on_validated_batch(
                calls,
                catalog=catalog,
                keys=keys,
                policies=feed.current,
                fetch=storage.fetch,
                now=datetime.now(UTC),
            )
        )
        return [
            next(decided) if call is not None else unreadable(event, "authorizer", "unreadable")
            for event, call in zip(events, parsed, strict=True)
        ]

    async def validator(stream: faust.StreamT[bytes]) -> None:
        await run_stage(stream, "validator", validate_batch)

    async def authorizer(stream: faust.StreamT[bytes]) -> None:
        await run_stage(stream, "authorizer", authorize_events)

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

    agents = {
        "validator": (Topic.PROPOSED, validator),
        "authorizer": (Topic.VALIDATED, authorizer),
    }
    for name, (source, agent) in agents.items():
        if name in stages:
            app.agent(topics[source], name=name)(agent)
    if settings.http_port > 0:
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
    if "approval-join" in stages:
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
        )

    async def _close_store(_app: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        await storage.close()
        await reply_producer.stop()
        observer.tracer.shutdown()

    app.on_before_shutdown.connect(_close_store)

    return app
