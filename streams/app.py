"""`ratifier approval-join`: the approval-join as a faust app, and nothing else (its
changelog-backed table is why faust is here). The stateless stages run in `ratifier stages`
(streams/stages_service.py), the approval HTTP API there too; this process serves its health
and metrics on the runtime's HTTP server (runtime/health.py), not on faust's web server.

At-least-once: outputs are acknowledged before offsets are committed, and the join is
idempotent by `call_id`, so a redelivered record is harmless.
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

from commands.catalog import Catalog
from config.settings import KafkaConnection, Settings
from feeds.freezes import FleetFreezes
from feeds.policies import PolicyFeed
from runtime.clients import (
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    database_conninfo,
    fetch_bytes,
    kafka_ssl_context,
    token_provider,
)
from runtime.health import Health, serve_health
from runtime.heap import settle_heap
from runtime.identity import context_keys
from runtime.retry import retrying
from schemas.names import STREAMS_APP_ID, Topic
from streams.approval_join import install_approval_join
from streams.faust_patches import install_faust_patches
from streams.observe import StageObserver
from streams.publisher import StagePublisher, stage_replies
from streams.stages_service import known_stages, limits_from
from streams.storage import StreamStorage
from telemetry.metrics import refresh_consumer_lag
from telemetry.tracing import tracer_from

log = logging.getLogger("ratifier.streams")

# How the benchmark's faust identity hop batches (bench/faust_identity.py, the T1 baseline).
BATCH_MAX = 500
BATCH_WITHIN = 0.005  # seconds a partial batch waits for more records
LAG_REFRESH_SECONDS = 5.0


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


class DeliveredPositions:
    """The join's consumer as the lag refresh and the readiness probe read it: assignment and
    high watermarks as faust's consumer has them, and as each partition's position the offset
    after the last record faust delivered to the join (None before the first, which leaves
    the lag unknown; faust's read offset right after a seek is the next one, so a position
    may be one record ahead, never past the high watermark). Never a question to the consumer
    thread: aiokafka's `position` waits for a partition without a position until it has one,
    which after a cut could be minutes, and the timer that keeps `/readyz` current waited with
    it (docs/reliability.md, "Findings")."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def assignment(self) -> Any:
        return self._consumer.assignment()

    def highwater(self, tp: Any) -> int | None:
        highwater: int | None = self._consumer.highwater(tp)
        return highwater

    async def position(self, tp: Any) -> int | None:
        read: int | None = self._consumer._read_offset.get(tp)
        if read is None:
            return None
        highwater = self.highwater(tp)
        return read + 1 if highwater is None else min(read + 1, highwater)


def create_app(
    settings: Settings, *, catalog: Catalog, feed: PolicyFeed, **faust_options: Any
) -> faust.App:
    """A faust app with the approval-join agent, its table and timer, and nothing else."""
    install_faust_patches()
    app = faust.App(
        settings.group(STREAMS_APP_ID),
        **faust_settings(settings),
        # Approval state is recovered from the changelog by the partition's new owner; no
        # standby copies, so a worker's timer only ever sees partitions it owns.
        table_standby_replicas=0,
        # Health and metrics are served by the runtime's HTTP server (below), not faust's.
        web_enabled=False,
        **faust_options,
    )
    limits = limits_from(settings)
    keys = context_keys(settings)
    storage = StreamStorage(database_conninfo(settings))
    topics = {
        t: app.topic(settings.topic(t), key_type=bytes, value_type=bytes, internal=False)
        for t in Topic
    }

    health = Health.of("approval-join", settings)
    observer = StageObserver(tracer_from(settings, service="streams"))
    replies, reply_producer = stage_replies(settings)
    publisher = StagePublisher(topics, replies=replies)
    known_stages(settings)
    # The kill switch (commands/freezes.py): a frozen scope ends a call instead of committing.
    freezes = FleetFreezes(settings)
    freezes_ready = asyncio.Event()
    closers: list[Any] = []

    async def serve_health_pages() -> None:
        closers.append(
            await serve_health(
                settings.observability.metrics_host, settings.streams.http_port, health
            )
        )

    app.task(serve_health_pages)

    async def follow_freezes() -> None:
        await retrying(
            partial(freezes.follow, freezes_ready), retry_on=(KafkaError, OSError), what="controls"
        )

    app.task(follow_freezes)

    async def follow_policies() -> None:
        await feed.follow()

    app.task(follow_policies)

    @app.timer(interval=LAG_REFRESH_SECONDS)  # type: ignore[untyped-decorator]  # faust's is untyped
    async def refresh_lag() -> None:
        delivered = DeliveredPositions(app.consumer)
        await refresh_consumer_lag(delivered, settings.group(STREAMS_APP_ID))
        # Health: faust fetches in its own service; this timer turning is the worker's loop
        # turning, and the consumer's assignment and lag are read as the executor's are.
        if app.rebalancing:
            health.waiting_for("rebalancing")
        else:
            health.running()
            health.polled()
            await health.observe(delivered)

    del refresh_lag  # registered with the app

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

    async def _close(_app: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        await storage.close()
        await reply_producer.stop()
        observer.tracer.shutdown()
        for close in reversed(closers):
            await close()

    app.on_before_shutdown.connect(_close)

    return app


class JoinWorker(faust.Worker):
    """faust's worker, which leaves the heap it started with out of garbage collection passes
    (runtime/heap.py) once the app runs."""

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        settle_heap(STREAMS_APP_ID)


def run_worker(app: faust.App, settings: Settings) -> None:
    """Run ``app`` in a faust worker until a signal stops it (faust's own signal handling)."""
    worker = JoinWorker(app, loglevel=settings.observability.log_level.upper(), quiet=True)
    # The terminal spinner sets the root logger to DEBUG so that every log call spins it:
    # each produced and consumed record then builds a DEBUG LogRecord (~7 % of a stage's CPU).
    worker.spinner = None
    worker.execute_from_commandline()
