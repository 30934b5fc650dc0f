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
publish loses nothing (a repeat is an identical outcome under the same call id). Database and
broker errors never end the process: the cycle is retried with a capped backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from commands.catalog import Catalog, Connection, EffectRequest, HandlerResult
from commands.sql import named_query
from executors.ledger import CommandLedger
from executors.service import crash_hook
from runtime.clients import database_conninfo, kafka_consumer, kafka_producer
from runtime.emit import Emit
from runtime.health import Health, serve_health
from runtime.replies import ReplySender, send_reply
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
from telemetry.metrics import (
    RECONCILIATIONS,
    observe_record,
    refresh_consumer_lag,
    set_reconciliation_queue,
)
from telemetry.tracing import (
    TraceParent,
    Tracer,
    format_traceparent,
    new_trace_id,
    traceparent_of,
    tracer_from,
)

log = logging.getLogger("ratifier.reconciler")
_PKG = "executors"
METRICS_REFRESH_SECONDS = 5.0
MAX_REMEMBERED_PARENTS = 10_000
# Due operations checked per cycle (one transaction each), and owed outcomes per publish.
CHECKS_PER_CYCLE = 20
OUTBOX_BATCH = 200
# How long one cycle waits for a database connection and for the broker's acknowledgements.
CONNECT_TIMEOUT_SECONDS = 5.0
PUBLISH_TIMEOUT_SECONDS = 15.0
# A failed cycle (database or broker unavailable) is retried after this backoff: doubling from
# the first delay, capped (docs/execution.md: the settlement bound).
OUTAGE_RETRY_FIRST_SECONDS = 0.5
OUTAGE_RETRY_CAP_SECONDS = 5.0
LAST_CHECK_MAX_CHARS = 300

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


def outage_retry_seconds(failures: int) -> float:
    """Delay before retrying a cycle after ``failures`` consecutive failed cycles."""
    first, cap = OUTAGE_RETRY_FIRST_SECONDS, OUTAGE_RETRY_CAP_SECONDS
    return backoff_seconds(max(failures - 1, 0), first, cap)


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
        owed = await self._owe(conn, row, outcome, settled=True)
        await self._ledger.audit(
            conn,
            tenant=row["tenant"],
            call_id=row["call_id"],
            kind="reconciled",
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
            kind="escalated",
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
        self,
        producer: AIOKafkaProducer,
        settings: Settings,
        *,
        tracer: Tracer | None = None,
        parents: dict[str, TraceParent] | None = None,
        operation_id: str | None = None,
    ) -> int:
        """Publish every outcome of the outbox not yet published (or those of one
        operation), then mark them once the broker has acknowledged them; return how many.
        A crash before the mark publishes them again: an identical outcome, same call id."""
        published = 0
        while True:
            async with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor() as cur,
            ):
                await cur.execute(
                    named_query(_PKG, "owed_outcomes"),
                    {"operation_id": operation_id, "limit": OUTBOX_BATCH},
                )
                rows = await cur.fetchall()
                if not rows:
                    return published
                outcomes = [Outcome.model_validate(r["outcome"]) for r in rows]
                await asyncio.wait_for(
                    publish_outcomes(producer, settings, outcomes, tracer=tracer, parents=parents),
                    timeout=PUBLISH_TIMEOUT_SECONDS,
                )
                await cur.execute(
                    named_query(_PKG, "mark_published"), {"ids": [r["id"] for r in rows]}
                )
            published += len(rows)
            if len(rows) < OUTBOX_BATCH:
                return published

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
                kind="resolved_by_human",
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


def _hop(tracer: Tracer, outcome: Outcome, parent: TraceParent | None, started: int) -> bytes:
    """Count a reconciled outcome, record its span; the `traceparent` it is published with."""
    ended = time.time_ns()
    code = outcome.error.code.value if outcome.error is not None else None
    observe_record(
        "reconcile", status=outcome.status.value, code=code, seconds=(ended - started) / 1e9
    )
    trace_id = outcome.trace_id or new_trace_id()
    span_id = tracer.record(
        stage="reconcile",
        trace_id=trace_id,
        parent=parent,
        start_ns=started,
        end_ns=ended,
        attributes={
            "ratifier.stage": "reconcile",
            "ratifier.status": outcome.status.value,
            "ratifier.error_code": code,
            "ratifier.call_id": outcome.call_id,
            "ratifier.tool": outcome.tool,
        }
        if tracer.enabled
        else {},
    )
    return format_traceparent(trace_id, span_id)


async def publish_outcomes(
    producer: AIOKafkaProducer,
    settings: Settings,
    outcomes: list[Outcome],
    *,
    tracer: Tracer | None = None,
    parents: dict[str, TraceParent] | None = None,
    started: int | None = None,
) -> None:
    """Publish reconciled outcomes, each in its call's trace, and wait for the broker's
    acknowledgements; ``parents`` (operation id to the executor's hop, from
    `commands.unknown`) links a span to the executor's when it is in the same trace."""
    tracer = tracer or Tracer()
    parents = parents if parents is not None else {}
    begun = started or time.time_ns()
    # Each outcome's reply copy (runtime/replies.py), best-effort, like every stage's.
    replies = ReplySender(
        partial(send_reply, producer),
        namespace=settings.reply_namespace,
        timeout=settings.reply_send_timeout_seconds,
        skip_for=settings.reply_skip_seconds,
    )
    futures = []
    reply_acks = []
    for o in outcomes:
        parent = parents.get(o.operation_id or "")
        if parent is not None and parent.trace_id != o.trace_id:
            parent = None  # the executor's hop of another call waiting on this operation
        hop = _hop(tracer, o, parent, begun)
        futures.append(
            await producer.send(
                settings.topic(Topic.OUTCOMES),
                key=o.call_id.encode(),
                value=o.to_bytes(),
                headers=[(TRACEPARENT_HEADER, hop)],
            )
        )
        reply_acks += await replies.send((Emit(topic=Topic.OUTCOMES, key=o.call_id, value=o),), hop)
    for future in futures:
        await future
    await replies.settle(reply_acks)
    for o in outcomes:
        parents.pop(o.operation_id or "", None)


def _new_pool(settings: Settings) -> AsyncConnectionPool[Any]:
    return AsyncConnectionPool(
        database_conninfo(settings),
        min_size=1,
        max_size=2,
        open=False,
        timeout=CONNECT_TIMEOUT_SECONDS,
        check=AsyncConnectionPool.check_connection,
        kwargs={"row_factory": dict_row, "connect_timeout": int(CONNECT_TIMEOUT_SECONDS)},
    )


def _new_consumer(settings: Settings) -> AIOKafkaConsumer:
    return kafka_consumer(
        settings, settings.topic(Topic.UNKNOWN), group=settings.group(RECONCILER_GROUP)
    )


def _new_producer(settings: Settings) -> AIOKafkaProducer:
    return kafka_producer(settings)


async def _start(client: AIOKafkaConsumer | AIOKafkaProducer) -> None:
    """Start a Kafka client; one that failed to start is stopped (the next try uses a new
    one)."""
    try:
        await client.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await client.stop()
        raise


async def _pause(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep, but wake at once when the process is asked to stop."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=seconds)


async def run_reconciler(
    settings: Settings,
    catalog: Catalog,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Wake on `commands.unknown`, check what is due, publish what is owed; on a database or
    broker error, back off and retry the cycle (a fresh database pool each time: psycopg's
    own reconnection backs off without a cap), never exit. ``prepare`` (migrations, topics)
    runs first, retried the same way."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    crash = crash_hook(settings.reconciler_crash_at)
    await catalog.start(settings)
    health = Health.of("reconciler", settings)
    close_metrics = await serve_health(
        settings.metrics_host, settings.reconciler_metrics_port, health
    )
    tracer = tracer_from(settings, service="reconciler")
    group = settings.group(RECONCILER_GROUP)
    parents: dict[str, TraceParent] = {}
    pool: AsyncConnectionPool[Any] | None = None
    reconciler: Reconciler | None = None
    # Created (again) until they start: the broker may be down when the reconciler starts.
    producer: AIOKafkaProducer | None = None
    consumer: AIOKafkaConsumer | None = None
    metrics_due = 0.0
    failures = 0
    log.info("reconciler starting on %s", settings.topic(Topic.UNKNOWN))
    try:
        while not stopping.is_set():
            try:
                if prepare is not None:
                    await prepare()
                    prepare = None
                if producer is None:
                    fresh_producer = _new_producer(settings)
                    await _start(fresh_producer)
                    producer = fresh_producer
                if consumer is None:
                    fresh_consumer = _new_consumer(settings)
                    await _start(fresh_consumer)
                    consumer = fresh_consumer
                if pool is None or reconciler is None:
                    pool = _new_pool(settings)
                    await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
                    reconciler = Reconciler(
                        pool=pool,
                        catalog=catalog,
                        attempts=settings.reconcile_attempts,
                        backoff_base=settings.reconcile_backoff_seconds,
                        backoff_cap=settings.reconcile_backoff_cap_seconds,
                    )
                # New unknown operations are already in the ledger as `unknown`; the topic is
                # a wake-up call, and its offsets are committed once they are seen.
                if not health.started:
                    health.running()
                batches = await consumer.getmany(timeout_ms=500, max_records=500)
                health.polled()
                for records in batches.values():
                    for record in records:
                        parent = traceparent_of(record.headers)
                        if parent and record.key and len(parents) < MAX_REMEMBERED_PARENTS:
                            parents[record.key.decode(errors="replace")] = parent
                # Whatever an earlier cycle or process settled and did not publish, first.
                await reconciler.publish_owed(producer, settings, tracer=tracer, parents=parents)
                if await reconciler.run_due():
                    crash("after_settle")  # crash tests: settled and committed, not published
                    await reconciler.publish_owed(
                        producer, settings, tracer=tracer, parents=parents
                    )
                if batches:
                    await consumer.commit()
                if time.monotonic() >= metrics_due:
                    metrics_due = time.monotonic() + METRICS_REFRESH_SECONDS
                    await refresh_consumer_lag(consumer, group)
                    await health.observe(consumer)
                    await reconciler.refresh_queue_metrics()
                if failures:
                    log.info("reconciler recovered after %d failed cycles", failures)
                failures = 0
            except DependencyError as exc:
                health.waiting_for(f"{type(exc).__name__}: {str(exc) or 'no answer in time'}")
                health.started = False
                failures += 1
                delay = outage_retry_seconds(failures)
                log.warning(
                    "reconciler cycle failed (%s: %s); retry in %.1fs",
                    type(exc).__name__,
                    str(exc) or "no answer in time",
                    delay,
                )
                if pool is not None and isinstance(exc, (psycopg.Error, PoolTimeout)):
                    await pool.close(timeout=1.0)
                    pool = reconciler = None
                await _pause(stopping, delay)
    finally:
        await close_metrics()
        tracer.shutdown()
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()
        await catalog.stop()
        if pool is not None:
            await pool.close()
