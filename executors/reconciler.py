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
  budget is spent → `retry_exhausted`, escalated (`ratifier ops unknown`), the reservation
  kept until a human resolves it (`ratifier ops resolve`).

Every call answered `unknown` for the operation (`unknown_calls`: the call that started it and
any retry under the same idempotency key) is owed the settled outcome, readdressed to its own
call id and trace. The settlement transaction writes those outcomes to an outbox
(`settlement_outbox`); they are published, acknowledged by the broker, then marked, and
unmarked ones are published again at start and on every cycle, so a crash between commit and
publish loses nothing (a repeat is an identical outcome under the same call id).

The process is the runtime's consumer loop (runtime/loop.py): its handler only acknowledges
the wake-up records; its ``tick`` (after every poll) checks what is due and hands the owed
outcomes to the loop, which publishes them with per-record isolation and waits out a broker
outage. Database errors fail that tick only; it is retried on the runtime's backoff ladder
with a fresh pool, and the process never exits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import KafkaError
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from commands.catalog import Catalog, Connection, EffectRequest, HandlerResult
from commands.sql import named_query
from executors.budgets import BudgetBook
from executors.crash_points import NO_CRASH_POINTS, CrashPoint, CrashPoints
from executors.ledger import CommandLedger
from runtime.clients import (
    database_conninfo,
    kafka_consumer,
    kafka_producer,
    pg_pool,
    start_kafka_client,
)
from runtime.emit import Emit
from runtime.health import Health, serve_health
from runtime.hop import record_emits_hop
from runtime.loop import ConsumerLoop, Handled
from runtime.retry import Stopped, retrying
from runtime.signals import stop_on_signals
from schemas.envelopes import ErrorInfo, Outcome, ReplyAddress, Stage, Status
from schemas.errors import (
    ErrorCode,
    OutcomeUnknown,
    PermanentFailure,
    StorageUnavailable,
    TransientFailure,
)
from schemas.names import RECONCILER_GROUP, TRACEPARENT_HEADER, Topic
from schemas.settings import Settings
from schemas.vocabulary import AuditKind
from telemetry.metrics import RECONCILIATIONS, set_reconciliation_queue
from telemetry.tracing import TraceParent, Tracer, new_trace_id, traceparent_of, tracer_from

log = logging.getLogger("ratifier.reconciler")
_PKG = "executors"
METRICS_REFRESH_SECONDS = 5.0
MAX_REMEMBERED_PARENTS = 10_000
# Due operations checked per cycle (one transaction each), and owed outcomes per publish.
CHECKS_PER_CYCLE = 20
OUTBOX_BATCH = 200
# How long a cycle waits for a database connection (a connection attempt included).
CONNECT_TIMEOUT_SECONDS = 5.0
LAST_CHECK_MAX_CHARS = 300

# What fails a cycle (retried on the runtime's ladder), never the process.
DependencyError = (
    psycopg.Error,
    PoolTimeout,
    KafkaError,
    TimeoutError,
    OSError,
    StorageUnavailable,
)


def backoff_seconds(attempt: int, base: float, cap: float = 300.0) -> float:
    """Exponential, capped (five minutes unless configured otherwise)."""
    return float(min(base * 2**attempt, cap))


@dataclass(frozen=True, kw_only=True)
class WaitingCall:
    """A call answered `unknown` for an operation, owed its settled outcome."""

    call_id: str
    trace_id: str | None
    reply_to: ReplyAddress | None = None  # v1.3: its settled outcome is copied there too


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What reconciliation concluded for one operation."""

    outcome: Outcome | None  # None: not settled yet (check again later, or escalated)
    escalated: bool = False
    # The outcomes owed to every waiting call (written to the outbox), the first one's first.
    owed: tuple[Outcome, ...] = ()


def waiting_calls(row: dict[str, Any], recorded: Sequence[WaitingCall]) -> list[WaitingCall]:
    """Every call owed the operation's settled outcome, each once: the call that started it
    (the ledger entry's), then those recorded as answered `unknown`. The entry's own call
    keeps the trace of its unknown outcome when that outcome was its own."""
    unknown = row.get("outcome") or {}
    own = unknown.get("call_id") == row["call_id"]
    calls: dict[str, WaitingCall] = {
        row["call_id"]: WaitingCall(
            call_id=row["call_id"],
            trace_id=unknown.get("trace_id") if own else None,
            reply_to=_reply_to(unknown.get("reply_to")) if own else None,
        )
    }
    for call in recorded:
        known = calls.get(call.call_id)
        if known is None or (known.trace_id is None and call.trace_id is not None):
            calls[call.call_id] = call
        elif known.reply_to is None and call.reply_to is not None:
            calls[call.call_id] = WaitingCall(
                call_id=known.call_id, trace_id=known.trace_id, reply_to=call.reply_to
            )
    return list(calls.values())


def readdressed(outcome: Outcome, calls: Sequence[WaitingCall]) -> list[Outcome]:
    """The one settled outcome, once per waiting call, in that call's own trace, to that
    call's own reply address."""
    return [
        outcome.model_copy(
            update={
                "call_id": call.call_id,
                "trace_id": call.trace_id or outcome.trace_id,
                "reply_to": call.reply_to,
            }
        )
        for call in calls
    ]


def _reply_to(raw: Any) -> ReplyAddress | None:
    """A reply address as recorded (JSON), None when absent or unreadable."""
    if raw is None:
        return None
    try:
        return ReplyAddress.model_validate(raw)
    except ValidationError:
        return None


def describe_failure(exc: BaseException) -> str:
    """The last check's result as `ratifier ops unknown` shows it."""
    text = f"cannot tell: {type(exc).__name__}: {exc}".strip().rstrip(":")
    return text[:LAST_CHECK_MAX_CHARS]


def _outcome(
    row: dict[str, Any],
    status: Status,
    *,
    code: ErrorCode | None = None,
    done: HandlerResult | None = None,
) -> Outcome:
    unknown = row.get("outcome") or {}
    return Outcome(
        call_id=row["call_id"],
        tool=row["tool"],
        tenant=row["tenant"],
        status=status,
        stage=Stage.RECONCILE,
        error=ErrorInfo.of(code) if code is not None else None,
        result=done.result if done else None,
        resource_id=done.resource_id if done else None,
        operation_id=row["operation_id"],
        # The version the command was authorized under, as recorded with its unknown outcome.
        policy_version=unknown.get("policy_version"),
        at=datetime.now(UTC),
        # The call's trace, as recorded with its unknown outcome.
        trace_id=unknown.get("trace_id") or new_trace_id(),
        reply_to=_reply_to(unknown.get("reply_to")),
    )


class Reconciler:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        catalog: Catalog,
        attempts: int,
        backoff_base: float,
        backoff_cap: float = 300.0,
    ) -> None:
        self._pool = pool
        self._catalog = catalog
        self._attempts = attempts
        self._backoff = backoff_base
        self._backoff_cap = backoff_cap
        self._ledger = CommandLedger()
        self._budgets = BudgetBook()

    async def _owe(
        self, conn: Connection, row: dict[str, Any], outcome: Outcome, *, settled: bool
    ) -> tuple[Outcome, ...]:
        """Write the outcome owed to every waiting call to the outbox (in the caller's
        transaction); once settled, the operation has no waiting calls any more."""
        key = {"tenant": row["tenant"], "idempotency_key": row["idempotency_key"]}
        async with conn.cursor() as cur:
            await cur.execute(named_query(_PKG, "waiting_calls"), key)
            recorded = [
                WaitingCall(
                    call_id=r["call_id"], trace_id=r["trace_id"], reply_to=_reply_to(r["reply_to"])
                )
                for r in await cur.fetchall()
            ]
            owed = readdressed(outcome, waiting_calls(row, recorded))
            for each in owed:
                await cur.execute(
                    named_query(_PKG, "owe_outcome"),
                    {
                        "tenant": row["tenant"],
                        "operation_id": row["operation_id"],
                        "call_id": each.call_id,
                        "outcome": Jsonb(each.model_dump(mode="json")),
                    },
                )
            if settled:
                await cur.execute(named_query(_PKG, "forget_waiting_calls"), key)
        return tuple(owed)

    async def _settle(
        self, conn: Connection, row: dict[str, Any], outcome: Outcome, *, check: str
    ) -> Verdict:
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "settle_unknown"),
                {
                    "tenant": row["tenant"],
                    "idempotency_key": row["idempotency_key"],
                    "status": outcome.status.value,
                    "outcome": Jsonb(outcome.model_dump(mode="json")),
                    "last_check": check,
                },
            )
            settled = await cur.fetchone() is not None
        if not settled:
            return Verdict(outcome=None)
        # The reservations held while it was unknown follow the settled result.
        await self._budgets.settle(
            conn, tenant=row["tenant"], operation_id=row["operation_id"], status=outcome.status
        )
        owed = await self._owe(conn, row, outcome, settled=True)
        await self._ledger.audit(
            conn,
            tenant=row["tenant"],
            call_id=row["call_id"],
            kind=AuditKind.RECONCILED,
            detail={
                "operation_id": row["operation_id"],
                "status": outcome.status.value,
                "code": outcome.error.code.value if outcome.error else None,
                "attempts": row["reconcile_attempts"] + 1,
                "calls": [o.call_id for o in owed],
            },
        )
        return Verdict(outcome=outcome, owed=owed)

    async def reconcile_row(self, conn: Connection, row: dict[str, Any]) -> Verdict:
        """One check of one unknown operation (its ledger row is locked by the caller)."""
        tool = self._catalog.get(row["tool"])
        if tool is None or tool.external is None or row["effect"] is None:
            return await self._later(conn, row, "no reconcile hook for this tool", escalate=True)
        external = tool.external
        request = EffectRequest(
            operation_id=row["operation_id"], tenant=row["tenant"], payload=row["effect"]
        )
        try:
            found = await external.lookup(request)
            check = "applied downstream"
            if found is None:
                # Definitely not applied: send it again under the same key.
                check = "not applied downstream: sent again"
                found = await external.invoke(request)
        except PermanentFailure as exc:
            await external.release(conn, request)
            outcome = _outcome(row, Status.FAILED, code=ErrorCode.PERMANENT_ERROR)
            return await self._settle(conn, row, outcome, check=f"failed downstream: {exc}")
        except (TransientFailure, OutcomeUnknown) as exc:
            return await self._later(conn, row, describe_failure(exc))
        except Exception as exc:  # a faulty hook must not stop the other operations
            log.exception("reconcile hook of %s failed", row["operation_id"])
            return await self._later(conn, row, describe_failure(exc))
        await external.settle(conn, request, found)
        outcome = _outcome(row, Status.SUCCEEDED, done=found)
        return await self._settle(conn, row, outcome, check=check)

    async def _later(
        self, conn: Connection, row: dict[str, Any], check: str, *, escalate: bool = False
    ) -> Verdict:
        attempt = int(row["reconcile_attempts"]) + 1
        escalate = escalate or attempt >= self._attempts
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "schedule_check"),
                {
                    "tenant": row["tenant"],
                    "idempotency_key": row["idempotency_key"],
                    "delay": backoff_seconds(attempt, self._backoff, self._backoff_cap),
                    "escalate": escalate,
                    "last_check": check[:LAST_CHECK_MAX_CHARS],
                },
            )
        if not escalate:
            return Verdict(outcome=None)
        await self._ledger.audit(
            conn,
            tenant=row["tenant"],
            call_id=row["call_id"],
            kind=AuditKind.ESCALATED,
            detail={"operation_id": row["operation_id"], "attempts": attempt},
        )
        log.error("operation %s escalated after %d checks", row["operation_id"], attempt)
        outcome = _outcome(row, Status.FAILED, code=ErrorCode.RETRY_EXHAUSTED)
        # The waiting calls stay recorded: a human's resolution is owed to them too.
        owed = await self._owe(conn, row, outcome, settled=False)
        return Verdict(outcome=outcome, escalated=True, owed=owed)

    async def run_due(self, limit: int = CHECKS_PER_CYCLE) -> list[Outcome]:
        """Check up to ``limit`` due operations once each, one transaction per operation;
        return the outcomes each settlement or escalation now owes (already committed to the
        outbox: `publish_owed` publishes them)."""
        owed: list[Outcome] = []
        for _ in range(limit):
            async with self._pool.connection() as conn, conn.transaction():
                async with conn.cursor() as cur:
                    await cur.execute(named_query(_PKG, "due_unknown"), {"limit": 1})
                    found = await cur.fetchone()
                if found is None:
                    break
                verdict = await self.reconcile_row(conn, dict(found))
            RECONCILIATIONS.labels(
                "escalated"
                if verdict.escalated
                else "settled"
                if verdict.outcome is not None
                else "rescheduled"
            ).inc()
            owed.extend(verdict.owed)
        return owed

    async def publish_owed(
        self, producer: AIOKafkaProducer, settings: Settings, *, operation_id: str
    ) -> int:
        """Publish the unpublished outcomes of one operation's outbox at once (`ratifier ops
        resolve`), then mark them once the broker has acknowledged them; return how many.
        Should this fail, the running reconcilers publish them."""
        outbox = Outbox(self._pool)
        outcomes = await outbox.take(operation_id=operation_id)
        try:
            for handled in publications(outcomes, {}):
                (emit,) = handled.emits
                traceparent = record_emits_hop(
                    Tracer(),
                    Stage.RECONCILE,
                    handled.emits,
                    parent=None,
                    start_ns=time.time_ns(),
                    end_ns=time.time_ns(),
                )
                await producer.send_and_wait(
                    settings.topic(emit.topic),
                    key=emit.key.encode() if emit.key is not None else None,
                    value=emit.value.to_bytes(),
                    headers=[(TRACEPARENT_HEADER, traceparent)],
                )
        except BaseException:
            await outbox.abandon()
            raise
        await outbox.acknowledged()
        return len(outcomes)

    async def resolve(
        self, tenant: str, operation_id: str, *, applied: bool, reference: str | None, by: str
    ) -> Outcome | None:
        """A human's resolution of an escalated (or any unknown) operation: settle or
        release it, once; the outcome is owed to every waiting call (`publish_owed`)."""
        async with self._pool.connection() as conn, conn.transaction():
            async with conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "unknown_for_update"),
                    {"tenant": tenant, "operation_id": operation_id},
                )
                found = await cur.fetchone()
            if found is None:
                return None
            row = dict(found)
            tool = self._catalog.get(row["tool"])
            request = EffectRequest(
                operation_id=operation_id, tenant=tenant, payload=row["effect"] or {}
            )
            if applied:
                done = HandlerResult(
                    result={
                        **request.payload,
                        "provider_ref": reference,
                        "status": "succeeded",
                        "resolved_by": by,
                    },
                    resource_id=str(request.payload.get("refund_id")),
                )
                if tool is not None and tool.external is not None:
                    await tool.external.settle(conn, request, done)
                outcome = _outcome(row, Status.SUCCEEDED, done=done)
            else:
                if tool is not None and tool.external is not None:
                    await tool.external.release(conn, request)
                outcome = _outcome(row, Status.FAILED, code=ErrorCode.PERMANENT_ERROR)
            await self._ledger.audit(
                conn,
                tenant=tenant,
                call_id=row["call_id"],
                kind=AuditKind.RESOLVED_BY_HUMAN,
                detail={
                    "operation_id": operation_id,
                    "applied": applied,
                    "reference": reference,
                    "by": by,
                },
            )
            verdict = await self._settle(conn, row, outcome, check=f"resolved by {by}")
            return verdict.outcome

    async def refresh_queue_metrics(self) -> None:
        try:
            async with self._pool.connection() as conn, conn.cursor() as cur:
                await cur.execute(named_query(_PKG, "reconciliation_queue"))
                found = await cur.fetchone()
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("reconciliation queue metrics unavailable: %s", exc)
            return
        if found is not None:
            set_reconciliation_queue(
                size=int(found["size"]),
                escalated=int(found["escalated"]),
                oldest_age_seconds=float(found["oldest_age_seconds"]),
            )


class Outbox:
    """Unpublished outcomes of the settlement outbox, taken (row-locked) in a transaction held
    open until the broker has acknowledged them (:meth:`acknowledged` marks them and commits)
    or they are given up (:meth:`abandon`): a concurrent reconciler skips them meanwhile, and
    a crash before the mark leaves them unmarked, to be published again."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._ids: list[int] = []

    async def take(
        self, *, operation_id: str | None = None, limit: int = OUTBOX_BATCH
    ) -> list[Outcome]:
        """Lock and return up to ``limit`` unpublished outcomes (of one operation, or all),
        oldest first."""
        await self.abandon()
        conn = self._conn = await self._pool.getconn()
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "owed_outcomes"), {"operation_id": operation_id, "limit": limit}
            )
            rows = await cur.fetchall()
        if not rows:
            await self.abandon()
            return []
        self._ids = [int(r["id"]) for r in rows]
        return [Outcome.model_validate(r["outcome"]) for r in rows]

    async def acknowledged(self) -> None:
        """The outcomes taken last are acknowledged by the broker: mark them published."""
        conn = self._conn
        if conn is None:
            return
        async with conn.cursor() as cur:
            await cur.execute(named_query(_PKG, "mark_published"), {"ids": self._ids})
        await conn.commit()
        await self._release()

    async def abandon(self) -> None:
        """Give the outcomes taken last back, unmarked (published again later)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.rollback()
            await self._release()

    async def _release(self) -> None:
        conn, self._conn, self._ids = self._conn, None, []
        if conn is not None:
            with contextlib.suppress(psycopg.Error, PoolTimeout):
                await self._pool.putconn(conn)


def publications(outcomes: Sequence[Outcome], parents: dict[str, TraceParent]) -> list[Handled]:
    """Owed outcomes as the loop publishes them, each its own hop in its call's trace.
    ``parents`` (operation id to the executor's hop, from `commands.unknown`) links a span to
    the executor's when it is in the same trace (another waiting call's trace is not)."""
    handled = []
    for outcome in outcomes:
        parent = parents.get(outcome.operation_id or "")
        handled.append(
            Handled(
                emits=(Emit(topic=Topic.OUTCOMES, key=outcome.call_id, value=outcome),),
                call_id=outcome.call_id,
                tool=outcome.tool,
                tenant=outcome.tenant,
                trace_id=outcome.trace_id,
                parent=parent
                if parent is not None and parent.trace_id == outcome.trace_id
                else None,
            )
        )
    for outcome in outcomes:
        parents.pop(outcome.operation_id or "", None)
    return handled


class ReconcilerService:
    """The reconciler's handler and tick on the runtime's consumer loop (runtime/loop.py)."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        *,
        prepare: Callable[[], Awaitable[None]] | None = None,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._prepare = prepare
        self.health = Health.of("reconciler", settings)
        self.stopping = asyncio.Event()
        self._crash_points = crash_points
        self._tracer = tracer_from(settings, service="reconciler")
        self._parents: dict[str, TraceParent] = {}
        self._loop: ConsumerLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._reconciler: Reconciler | None = None
        self._outbox: Outbox | None = None
        # Created (again) until they start: the broker may be down when the reconciler starts.
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._failures = 0
        self._metrics_due = 0.0

    def stop(self) -> None:
        self.stopping.set()
        if self._loop is not None:
            self._loop.stop()

    async def _cycle(self, step: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``step``; a dependency error fails this cycle only (the caller retries it):
        the service says why it waits, and a database error drops the pool (psycopg's own
        reconnection backs off without a cap; the next cycle opens a fresh one)."""
        try:
            result = await step()
        except DependencyError as exc:
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
            pool = pg_pool(
                database_conninfo(self._settings),
                max_size=2,
                dict_rows=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
            )
            try:
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
            except BaseException:
                await pool.close(timeout=1.0)
                raise
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

    async def _start(self) -> None:
        """Prepare (migrations check, topics), start the Kafka clients, open the pool; what
        failed to start is built anew on the next try."""
        settings = self._settings
        if self._prepare is not None:
            await self._prepare()
            self._prepare = None
        if self._producer is None:
            producer = kafka_producer(settings)
            await start_kafka_client(producer, settings.kafka)
            self._producer = producer
        if self._consumer is None:
            consumer = kafka_consumer(
                settings, settings.topic(Topic.UNKNOWN), group=settings.group(RECONCILER_GROUP)
            )
            await start_kafka_client(consumer, settings.kafka)
            self._consumer = consumer
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

    async def run(self) -> None:
        """Start (retried until the database and the broker answer), then run the loop."""
        settings = self._settings
        await self._catalog.start(settings)
        try:
            await retrying(
                lambda: self._cycle(self._start),
                retry_on=DependencyError,
                what="reconciler start",
                stop=self.stopping,
            )
            assert self._consumer is not None
            loop = self._loop = ConsumerLoop(
                settings,
                self._consumer,
                self._producer,
                stage=Stage.RECONCILE,
                group=settings.group(RECONCILER_GROUP),
                handle=self._wake_up,
                tracer=self._tracer,
                # A settled outcome the broker refuses is dead-lettered and answered without
                # its result, never replaced by a made-up failure.
                answers=None,
                retry_on=DependencyError,
                tick=self._tick,
                poll_ms=500,
                max_records=500,
                health=self.health,
            )
            if self.stopping.is_set():
                loop.stop()
            log.info("reconciler started on %s", settings.topic(Topic.UNKNOWN))
            await loop.run()
        finally:
            await self._drop_pool()
            if self._consumer is not None:
                await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
            await self._catalog.stop()
            self._tracer.shutdown()


async def run_reconciler(
    settings: Settings,
    catalog: Catalog,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
    crash_points: CrashPoints = NO_CRASH_POINTS,
) -> None:
    """Serve health at once; ``prepare`` (migrations check, topics) and connecting are
    retried until the database and the broker answer; then run until SIGTERM / SIGINT."""
    service = ReconcilerService(settings, catalog, prepare=prepare, crash_points=crash_points)
    stop_on_signals(service.stop)
    close = await serve_health(
        settings.observability.metrics_host,
        settings.observability.reconciler_metrics_port,
        service.health,
    )
    try:
        await service.run()
    except Stopped:
        log.info("reconciler stopped before it connected")
    finally:
        await close()
