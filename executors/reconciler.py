"""The reconciler: settles every `unknown` operation once, from the downstream system's own
record, or escalates it to humans. It never guesses.

`commands.unknown` (its own consumer group) tells it about new unknown operations; the durable
schedule is the ledger itself (`status = 'unknown'`, `next_check_at`, `reconcile_attempts`),
claimed one operation per transaction with `FOR UPDATE SKIP LOCKED`, so reconcilers scale out
and a restart neither loses nor repeats a check. For each due operation, the tool's reconcile
hook (`ExternalEffect.lookup`) asks the downstream system by operation id:

- applied → settle the domain state and the ledger once, publish `succeeded`;
- definitely not applied → send it again with the same operation id (the downstream
  idempotency key still protects it), then settle or release;
- failed downstream → release the reservation, publish `failed`;
- cannot tell (downstream unreachable) → check again later, with bounded backoff; when the
  budget is spent → escalated (`ratifier ops unknown`): the calls are told `unknown` /
  `retry_exhausted` (v1.9; before, `failed`, though the effect may have happened), the
  reservation kept until a human resolves it (`ratifier ops resolve`), whose outcome is the
  calls' final one.

Every call answered `unknown` for the operation (`unknown_calls`: the call that started it and
any retry under the same idempotency key) is owed the settled outcome, readdressed to its own
call id and trace. The settlement transaction writes those outcomes to an outbox
(`settlement_outbox`); they are published, acknowledged by the broker, then marked, and
unmarked ones are published again at start and on every cycle, so a crash between commit and
publish loses nothing (a repeat is an identical outcome under the same call id).

The process runs in the runtime's service shell (runtime/shell.py): health served at once,
the schema check, the broker and the database waited for at start (alive, not ready
meanwhile), signals, close in reverse order. Its main is the runtime's consumer loop
(runtime/loop.py): the handler only acknowledges the wake-up records; its ``tick`` (after
every poll) checks what is due and hands the owed outcomes to the loop, which publishes them
with per-record isolation and waits out a broker outage. Database errors fail that tick
only; it is retried on the runtime's backoff ladder with a fresh pool, and the process never
exits for them.

This module is the service; the domain (pure) is executors/reconciliation.py, the storage
(the ledger's schedule, settlement, the outbox) executors/reconciler_store.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from commands.catalog import Catalog
from config.settings import Settings
from executors.crash_points import NO_CRASH_POINTS, CrashPoint, CrashPoints
from executors.reconciler_store import Outbox as Outbox
from executors.reconciler_store import Reconciler as Reconciler
from executors.reconciliation import publications
from runtime.clients import (
    database_conninfo,
    pg_pool,
)
from runtime.health import Health
from runtime.loop import Handled, consumer_loop
from runtime.shell import ServiceShell, ShellWorker, StartupHook, run_until
from runtime.startup import DEPENDENCY_ERRORS, KafkaClients, open_pool
from schemas.envelopes import Stage
from schemas.errors import (
    StorageUnavailable,
)
from schemas.names import RECONCILER_GROUP, Topic
from telemetry.tracing import TraceParent, traceparent_of, tracer_from

log = logging.getLogger("ratifier.reconciler")
METRICS_REFRESH_SECONDS = 5.0
MAX_REMEMBERED_PARENTS = 10_000
# How long a cycle waits for a database connection (a connection attempt included).
CONNECT_TIMEOUT_SECONDS = 5.0


class ReconcilerService(ShellWorker):
    """The reconciler's handler and tick on the runtime's consumer loop (runtime/loop.py),
    in the service shell."""

    service = "reconciler"
    retry_on = DEPENDENCY_ERRORS

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        *,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self.health = Health.of("reconciler", settings)
        self.stopping = asyncio.Event()
        self._crash_points = crash_points
        self._tracer = tracer_from(settings, service="reconciler")
        self._parents: dict[str, TraceParent] = {}
        self._pool: AsyncConnectionPool[Any] | None = None
        self._reconciler: Reconciler | None = None
        self._outbox: Outbox | None = None
        self._kafka = KafkaClients(
            settings, settings.topic(Topic.UNKNOWN), group=settings.group(RECONCILER_GROUP)
        )
        self._failures = 0
        self._metrics_due = 0.0

    async def _cycle(self, step: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``step``; a dependency error fails this cycle only (the caller retries it):
        the service says why it waits, and a database error drops the pool (psycopg's own
        reconnection backs off without a cap; the next cycle opens a fresh one)."""
        try:
            result = await step()
        except DEPENDENCY_ERRORS as exc:
            why = f"{type(exc).__name__}: {str(exc) or 'no answer in time'}"
            self._failures += 1
            self.health.waiting_for(why)
            log.warning("reconciler cycle failed (%s)", why)
            if isinstance(exc, psycopg.Error | PoolTimeout | StorageUnavailable):
                await self._drop_pool()
            raise
        if self._failures:
            log.info("reconciler recovered after %d failed cycles", self._failures)
            self._failures = 0
            if self.health.started:  # else the loop says so when it starts
                self.health.running()
        return result

    async def _connect(self) -> Reconciler:
        if self._reconciler is None:
            pool = await open_pool(
                pg_pool(
                    database_conninfo(self._settings),
                    max_size=2,
                    dict_rows=True,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                ),
                wait_seconds=CONNECT_TIMEOUT_SECONDS,
            )
            self._pool, self._outbox = pool, Outbox(pool)
            self._reconciler = Reconciler(
                pool=pool,
                catalog=self._catalog,
                attempts=self._settings.reconciler.attempts,
                backoff_base=self._settings.reconciler.backoff_seconds,
                backoff_cap=self._settings.reconciler.backoff_cap_seconds,
            )
        return self._reconciler

    async def _drop_pool(self) -> None:
        if self._outbox is not None:
            await self._outbox.abandon()
        if self._pool is not None:
            await self._pool.close(timeout=1.0)
        self._pool = self._reconciler = self._outbox = None

    async def _start_database(self) -> None:
        await self._connect()

    async def _wake_up(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> list[Handled]:
        """New unknown operations are already in the ledger as `unknown`: the records only
        wake the reconciler up, and carry the executor's hop to link the settlement's span
        to."""
        for record in records:
            parent = traceparent_of(record.headers)
            if parent and record.key and len(self._parents) < MAX_REMEMBERED_PARENTS:
                self._parents[record.key.decode(errors="replace")] = parent
        return [Handled(observe=False)] * len(records)

    async def _tick(self) -> list[Handled]:
        return list(await self._cycle(self._due))

    async def _due(self) -> list[Handled]:
        """One cycle: mark what the last cycle handed to the loop (the loop runs the next
        tick only once all of it is acknowledged), check what is due, and hand the loop
        every outcome still owed, locked until the next cycle marks it."""
        reconciler = await self._connect()
        assert self._outbox is not None
        await self._outbox.acknowledged()
        if await reconciler.run_due():
            # crash tests: settled and committed, not published
            self._crash_points.reached(CrashPoint.AFTER_SETTLE)
        if time.monotonic() >= self._metrics_due:
            self._metrics_due = time.monotonic() + METRICS_REFRESH_SECONDS
            await reconciler.refresh_queue_metrics()
        return publications(await self._outbox.take(), self._parents)

    def wire(self, shell: ServiceShell) -> None:
        """After ``prepare``: the tool hooks, the broker and the database waited for
        (retried, not ready meanwhile); clients closed in reverse order."""
        shell.on_startup.append(StartupHook(name="tool hooks", run=self._start_catalog))
        shell.on_startup.append(StartupHook(name="broker", run=self._kafka.start))
        shell.on_startup.append(StartupHook(name="database", run=self._start_database))
        shell.on_shutdown.append(self._stop_tracer)
        shell.on_shutdown.append(self._catalog.stop)
        shell.on_shutdown.append(self._close_clients)

    async def _start_catalog(self) -> None:
        await self._catalog.start(self._settings)

    async def _stop_tracer(self) -> None:
        self._tracer.shutdown()

    async def _close_clients(self) -> None:
        await self._drop_pool()
        await self._kafka.stop()

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: the consumer loop until ``stop`` is set."""
        settings = self._settings
        assert self._kafka.consumer is not None
        loop = consumer_loop(
            settings,
            self._kafka.consumer,
            self._kafka.producer,
            stage=Stage.RECONCILE,
            group=settings.group(RECONCILER_GROUP),
            handle=self._wake_up,
            tracer=self._tracer,
            # A settled outcome the broker refuses is dead-lettered and answered without
            # its result, never replaced by a made-up failure.
            answers=None,
            retry_on=DEPENDENCY_ERRORS,
            tick=self._tick,
            poll_ms=500,
            max_records=500,
            health=self.health,
        )
        log.info("reconciler started on %s", settings.topic(Topic.UNKNOWN))
        await run_until(loop, stop)


async def run_reconciler(
    settings: Settings,
    catalog: Catalog,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
    crash_points: CrashPoints = NO_CRASH_POINTS,
) -> int:
    """Run `ratifier reconciler` in the service shell until SIGTERM / SIGINT; the exit code."""
    service = ReconcilerService(settings, catalog, crash_points=crash_points)
    shell = service.shell(
        prepare,
        http_port=settings.observability.reconciler_metrics_port,
        handle_signals=True,
    )
    return await shell.run(service.consume)
