"""The reconciler's storage: the ledger's schedule of unknown operations (claimed one per
transaction, `FOR UPDATE SKIP LOCKED`), their settlement, and the settlement outbox of owed
outcomes (executors/reconciler.py is the service that drives them)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from commands.catalog import Catalog, Connection, EffectRequest, HandlerResult
from commands.sql import named_query
from config.settings import Settings
from executors.budgets import BudgetBook
from executors.ledger import CommandLedger
from executors.reconciliation import (
    LAST_CHECK_MAX_CHARS,
    Verdict,
    WaitingCall,
    backoff_seconds,
    describe_failure,
    publications,
    readdressed,
    reply_address,
    settled_outcome,
    waiting_calls,
)
from runtime.hop import record_emits_hop
from schemas.envelopes import Actor, Outcome, Stage, Status
from schemas.errors import (
    ErrorCode,
    OutcomeUnknown,
    PermanentFailure,
    TransientFailure,
)
from schemas.names import TRACEPARENT_HEADER
from schemas.vocabulary import AuditKind
from telemetry.metrics import RECONCILIATIONS, set_reconciliation_queue
from telemetry.tracing import Tracer

log = logging.getLogger("ratifier.reconciler")
_PKG = "executors"
# Due operations checked per cycle (one transaction each), and owed outcomes per publish.
CHECKS_PER_CYCLE = 20
OUTBOX_BATCH = 200


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
                    call_id=r["call_id"],
                    trace_id=r["trace_id"],
                    reply_to=reply_address(r["reply_to"]),
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
            outcome = settled_outcome(row, Status.FAILED, code=ErrorCode.PERMANENT_ERROR)
            return await self._settle(conn, row, outcome, check=f"failed downstream: {exc}")
        except (TransientFailure, OutcomeUnknown) as exc:
            return await self._later(conn, row, describe_failure(exc))
        except Exception as exc:  # a faulty hook must not stop the other operations
            log.exception("reconcile hook of %s failed", row["operation_id"])
            return await self._later(conn, row, describe_failure(exc))
        await external.settle(conn, request, found)
        outcome = settled_outcome(row, Status.SUCCEEDED, done=found)
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
        # Still `unknown` (v1.9): nobody can tell yet whether the effect happened, so no
        # final answer is given; a human's resolution settles the calls.
        outcome = settled_outcome(row, Status.UNKNOWN, code=ErrorCode.RETRY_EXHAUSTED)
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
        self,
        tenant: str,
        operation_id: str,
        *,
        applied: bool,
        reference: str | None,
        by: Actor,
    ) -> Outcome | None:
        """A human's resolution of an escalated (or any unknown) operation: settle or
        release it, once; the outcome is owed to every waiting call (`publish_owed`). ``by``
        is the operator's verified identity (their context token's sub, tenant and roles),
        recorded in the audit: never a name typed on a command line."""
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
                        "resolved_by": by.sub,
                    },
                    resource_id=str(request.payload.get("refund_id")),
                )
                if tool is not None and tool.external is not None:
                    await tool.external.settle(conn, request, done)
                outcome = settled_outcome(row, Status.SUCCEEDED, done=done)
            else:
                if tool is not None and tool.external is not None:
                    await tool.external.release(conn, request)
                outcome = settled_outcome(row, Status.FAILED, code=ErrorCode.PERMANENT_ERROR)
            await self._ledger.audit(
                conn,
                tenant=tenant,
                call_id=row["call_id"],
                kind=AuditKind.RESOLVED_BY_HUMAN,
                detail={
                    "operation_id": operation_id,
                    "applied": applied,
                    "reference": reference,
                    "by": by.sub,
                    "by_tenant": by.tenant,
                    "by_roles": list(by.roles),
                },
            )
            verdict = await self._settle(conn, row, outcome, check=f"resolved by {by.sub}")
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
