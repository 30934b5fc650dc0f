"""The reconciler: settles every `unknown` operation once, from the downstream system's own
record, or escalates it to humans. It never guesses.

`commands.unknown` (its own consumer group) tells it about new unknown operations; the durable
schedule is the ledger itself (`status = 'unknown'`, `next_check_at`, `reconcile_attempts`),
claimed with `FOR UPDATE SKIP LOCKED` so reconcilers scale out and a restart neither loses nor
repeats a check. For each due operation, the tool's reconcile hook (`ExternalEffect.lookup`)
asks the downstream system by operation id:

- applied → settle the domain state and the ledger once, publish `succeeded`;
- definitely not applied → send it again with the same operation id (the downstream
  idempotency key still protects it), then settle or release;
- failed downstream → release the reservation, publish `failed`;
- cannot tell (downstream unreachable) → check again later, with bounded backoff; when the
  budget is spent → `retry_exhausted`, escalated (`ratifier ops unknown`), the reservation
  kept until a human resolves it (`ratifier ops resolve`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from commands.catalog import Catalog, Connection, EffectRequest, HandlerResult
from commands.sql import named_query
from executors.ledger import CommandLedger
from schemas.envelopes import ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode, OutcomeUnknown, PermanentFailure, TransientFailure
from schemas.names import RECONCILER_GROUP, TRACEPARENT_HEADER, Topic
from schemas.settings import Settings
from telemetry.metrics import (
    RECONCILIATIONS,
    observe_record,
    refresh_consumer_lag,
    serve_metrics,
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


def backoff_seconds(attempt: int, base: float) -> float:
    """Exponential, capped at five minutes."""
    return float(min(base * 2**attempt, 300.0))


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What reconciliation concluded for one operation."""

    outcome: Outcome | None  # None: not settled yet (check again later, or escalated)
    escalated: bool = False


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
    )


class Reconciler:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        catalog: Catalog,
        attempts: int,
        backoff_base: float,
    ) -> None:
        self._pool = pool
        self._catalog = catalog
        self._attempts = attempts
        self._backoff = backoff_base
        self._ledger = CommandLedger()

    async def _settle(self, conn: Connection, row: dict[str, Any], outcome: Outcome) -> bool:
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "settle_unknown"),
                {
                    "tenant": row["tenant"],
                    "idempotency_key": row["idempotency_key"],
                    "status": outcome.status.value,
                    "outcome": Jsonb(outcome.model_dump(mode="json")),
                },
            )
            settled = await cur.fetchone() is not None
        if settled:
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
                },
            )
        return settled

    async def reconcile_row(self, conn: Connection, row: dict[str, Any]) -> Verdict:
        """One check of one unknown operation (its ledger row is locked by the caller)."""
        tool = self._catalog.get(row["tool"])
        if tool is None or tool.external is None or row["effect"] is None:
            return await self._later(conn, row, escalate=True)
        external = tool.external
        request = EffectRequest(
            operation_id=row["operation_id"], tenant=row["tenant"], payload=row["effect"]
        )
        try:
            found = await external.lookup(request)
            if found is None:
                # Definitely not applied: send it again under the same key.
                found = await external.invoke(request)
        except PermanentFailure:
            await external.release(conn, request)
            outcome = _outcome(row, Status.FAILED, code=ErrorCode.PERMANENT_ERROR)
            return Verdict(outcome=outcome if await self._settle(conn, row, outcome) else None)
        except (TransientFailure, OutcomeUnknown):
            return await self._later(conn, row)
        await external.settle(conn, request, found)
        outcome = _outcome(row, Status.SUCCEEDED, done=found)
        return Verdict(outcome=outcome if await self._settle(conn, row, outcome) else None)

    async def _later(
        self, conn: Connection, row: dict[str, Any], *, escalate: bool = False
    ) -> Verdict:
        attempt = int(row["reconcile_attempts"]) + 1
        escalate = escalate or attempt >= self._attempts
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "schedule_check"),
                {
                    "tenant": row["tenant"],
                    "idempotency_key": row["idempotency_key"],
                    "delay": backoff_seconds(attempt, self._backoff),
                    "escalate": escalate,
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
        return Verdict(
            outcome=_outcome(row, Status.FAILED, code=ErrorCode.RETRY_EXHAUSTED), escalated=True
        )

    async def run_due(self, limit: int = 20) -> list[Outcome]:
        """Check every due operation once; return the outcomes to publish."""
        published: list[Outcome] = []
        async with self._pool.connection() as conn, conn.transaction():
            async with conn.cursor() as cur:
                await cur.execute(named_query(_PKG, "due_unknown"), {"limit": limit})
                rows = await cur.fetchall()
            for row in rows:
                verdict = await self.reconcile_row(conn, dict(row))
                RECONCILIATIONS.labels(
                    "escalated"
                    if verdict.escalated
                    else "settled"
                    if verdict.outcome is not None
                    else "rescheduled"
                ).inc()
                if verdict.outcome is not None:
                    published.append(verdict.outcome)
        return published

    async def resolve(
        self, tenant: str, operation_id: str, *, applied: bool, reference: str | None, by: str
    ) -> Outcome | None:
        """A human's resolution of an escalated (or any unknown) operation: settle or
        release it, once."""
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
            return outcome if await self._settle(conn, row, outcome) else None

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
    """Publish reconciled outcomes, each in its call's trace; ``parents`` (operation id to
    the executor's hop, from `commands.unknown`) links each span to the executor's."""
    tracer = tracer or Tracer()
    parents = parents if parents is not None else {}
    begun = started or time.time_ns()
    futures = [
        await producer.send(
            settings.topic(Topic.OUTCOMES),
            key=o.call_id.encode(),
            value=o.to_bytes(),
            headers=[
                (
                    TRACEPARENT_HEADER,
                    _hop(tracer, o, parents.pop(o.operation_id or "", None), begun),
                )
            ],
        )
        for o in outcomes
    ]
    for future in futures:
        await future


async def run_reconciler(settings: Settings, catalog: Catalog) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.database_url, min_size=1, max_size=4, open=False, kwargs={"row_factory": dict_row}
    )
    consumer = AIOKafkaConsumer(
        settings.topic(Topic.UNKNOWN),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.group(RECONCILER_GROUP),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await pool.open(wait=True, timeout=30)
    await catalog.start(settings)
    await producer.start()
    await consumer.start()
    reconciler = Reconciler(
        pool=pool,
        catalog=catalog,
        attempts=settings.reconcile_attempts,
        backoff_base=settings.reconcile_backoff_seconds,
    )
    close_metrics = await serve_metrics(settings.metrics_host, settings.reconciler_metrics_port)
    tracer = tracer_from(settings, service="reconciler")
    group = settings.group(RECONCILER_GROUP)
    parents: dict[str, TraceParent] = {}
    metrics_due = 0.0
    log.info("reconciler started on %s", settings.topic(Topic.UNKNOWN))
    try:
        while not stopping.is_set():
            # New unknown operations are already in the ledger as `unknown`; the topic is a
            # wake-up call, and its offsets are committed once they are seen.
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batches.values():
                for record in records:
                    parent = traceparent_of(record.headers)
                    if parent is not None and record.key and len(parents) < MAX_REMEMBERED_PARENTS:
                        parents[record.key.decode(errors="replace")] = parent
            started = time.time_ns()
            outcomes = await reconciler.run_due()
            await publish_outcomes(
                producer, settings, outcomes, tracer=tracer, parents=parents, started=started
            )
            if batches:
                await consumer.commit()
            if time.monotonic() >= metrics_due:
                metrics_due = time.monotonic() + METRICS_REFRESH_SECONDS
                await refresh_consumer_lag(consumer, group)
                await reconciler.refresh_queue_metrics()
    finally:
        await close_metrics()
        tracer.shutdown()
        await consumer.stop()
        await producer.stop()
        await catalog.stop()
        await pool.close()
