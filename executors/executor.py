"""Executing one committed command at most once in effect.

1. Redis claim (fast path): a finished operation is answered from its stored outcome; another
   fingerprint under the same key is a conflict; a live owner is left alone (we wait for it).
2. Ledger transaction (the authority): insert the entry — or, when it exists, answer from it,
   and never re-run an operation whose effect may have started. Inside the same transaction:
   cancellation check, commit-time re-check (resource re-read `FOR UPDATE` with the tenant in
   the WHERE, policy on fresh attributes, approval receipt), then the handler. An internal
   effect completes here; an external one is prepared here and marked `effect_pending`.
3. External effects only: invoke downstream with the operation id as idempotency key, with a
   bounded retry for failures known to precede any effect; then settle or release in a second
   transaction — only if the entry is still ours (fencing) and still pending. A timeout or a
   lost response ends as `unknown` and goes to reconciliation; nothing is retried blindly.

`execute_group` runs steps 2 and 3 for several commands of one partition batch with one
commit for their ledger work and one for their settlements (docs/execution.md, "Group
commit"); `claim_many` / `finish_many` take and finish a batch's Redis claims in one round
trip each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from approvals.auto import resource_owner
from approvals.signing import ApprovalKeys, approval_keys
from commands.budgets import BudgetExceeded
from commands.catalog import (
    Catalog,
    Connection,
    EffectRequest,
    ExecutionContext,
    ExternalEffect,
    HandlerResult,
    Resource,
    Tool,
    downstream_of,
)
from commands.freezes import FixedFreezes, FreezeSource
from commands.policy import PolicySource
from config.settings import Settings
from executors.budgets import BudgetBook
from executors.claims import Claim, ClaimFinish, ClaimKind, ClaimRequest, ClaimStore
from executors.crash_points import NO_CRASH_POINTS, CrashPoint, CrashPoints
from executors.decisions import (
    Dedup,
    Loaded,
    admission,
    command_freeze,
    dedup_decision,
    plain_read,
    resource_refusals,
)
from executors.ledger import CommandLedger
from executors.outcomes import (
    executed_detail,
    failed_outcome,
    outcome_of,
    refused_outcome,
    unavailable_outcome,
)
from runtime.breakers import FleetBreakers, Ticket, breaker_name
from schemas.envelopes import CommittedCommand, Effect, ErrorInfo, Outcome, Stage, Status
from schemas.errors import (
    DownstreamUnavailable,
    ErrorCode,
    OutcomeUnknown,
    PermanentFailure,
    RatifierError,
    StorageUnavailable,
    TransientFailure,
)
from schemas.vocabulary import AuditKind, LedgerStatus
from telemetry.metrics import count_dedup

log = logging.getLogger("ratifier.executor")

# A member of a group that meets another transaction's row lock (psycopg makes these
# OperationalError subclasses; they are not a lost connection).
_LOCK_CONFLICTS = (
    psycopg.errors.LockNotAvailable,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What running a command produced: its outcome, and whether that outcome must also go
    to reconciliation (`commands.unknown`)."""

    outcome: Outcome
    unknown: bool = False
    # Set when the ledger shows another owner's effect still pending (fencing number seen).
    pending_fence: int | None = None
    # With ``defer_finish``: the Redis claim to finish with this outcome, left to the caller
    # (which finishes a batch's claims in one round trip).
    claim_finish: ClaimFinish | None = None
    # The command reserved budget amounts in this transaction (docs/budgets.md): its
    # recorded outcome consumes or releases them.
    budgeted: bool = False
    # Refused before its effect by the downstream's open breaker: nothing of it is recorded
    # and its claim was given back, so the same call can run later.
    released: bool = False


@dataclass(frozen=True, kw_only=True)
class GroupMember:
    """A write command of a group commit, with its trace and its Redis claim (a claim of
    kind claimed, expired or unavailable: one the command may run under)."""

    command: CommittedCommand
    trace_id: str | None
    claim: Claim


@dataclass(frozen=True, kw_only=True)
class _Pending:
    """An external effect prepared and committed as `effect_pending`, to invoke now."""

    request: EffectRequest
    external: ExternalEffect
    fence: int
    budgeted: bool = False
    # The downstream's breaker let it through: each attempt's result is counted there.
    ticket: Ticket | None = None
    # What the commit-time check loaded: the last check before the effect decides on the
    # same facts (a freeze of the resource's owner, `subject:`, included).
    resource: Resource | None = None


@dataclass(frozen=True, kw_only=True)
class _Invoked:
    """What an external effect answered: the outcome to record, and its result or code."""

    outcome: Outcome
    done: HandlerResult | None
    code: ErrorCode | None


class _RetriesCut(Exception):
    """The breaker opened between two attempts of an effect: stop retrying."""


class CommandExecutor:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        claims: ClaimStore | None,
        catalog: Catalog,
        policies: PolicySource,
        cancelled: Container[str] = frozenset(),
        retry_attempts: int = 4,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        wait_for_owner_seconds: float = 30.0,
        receipt_keys: ApprovalKeys | None = None,
        freezes: FreezeSource | None = None,
        breakers: FleetBreakers | None = None,
    ) -> None:
        self._freezes = freezes or FixedFreezes()
        # The downstreams' circuit breakers, shared by every executor (None: none consulted).
        self._breakers = breakers
        # The keys receipts are verified with; by default this deployment's (settings).
        self._receipt_keys = receipt_keys or approval_keys(Settings())
        self._wait_for_owner = wait_for_owner_seconds
        self._pool = pool
        self._claims = claims
        self._catalog = catalog
        self._policies = policies
        self._cancelled = cancelled
        self._retry_attempts = retry_attempts
        self._crash_points = crash_points
        self._ledger = CommandLedger()
        self._budgets = BudgetBook()

    # -- outcomes ---------------------------------------------------------------------------

    def _outcome(
        self,
        command: CommittedCommand,
        *,
        status: Status,
        code: ErrorCode | None = None,
        result: dict[str, Any] | None = None,
        resource_id: str | None = None,
        trace_id: str | None,
        stage: Stage = Stage.EXECUTE,
        error: ErrorInfo | None = None,
    ) -> Outcome:
        return outcome_of(
            command,
            status=status,
            code=code,
            result=result,
            resource_id=resource_id,
            trace_id=trace_id,
            stage=stage,
            error=error,
        )

    def _failed(self, command: CommittedCommand, code: ErrorCode, trace_id: str | None) -> Outcome:
        return failed_outcome(command, code, trace_id)

    def _refused(
        self, command: CommittedCommand, exc: RatifierError, trace_id: str | None
    ) -> Outcome:
        return refused_outcome(command, exc, trace_id)

    @staticmethod
    def _readdressed(stored: Outcome, command: CommittedCommand) -> Outcome:
        """The stored outcome of this operation, answered to the call that asked again."""
        repeats = stored.repeats or stored.call_id
        return stored.model_copy(
            update={
                "call_id": command.call_id,
                "reply_to": command.reply_to,
                # v1.5: a repeat of the operation names the call it repeats.
                "repeats": repeats if repeats != command.call_id else None,
            }
        )

    # -- the flow ---------------------------------------------------------------------------

    def needs_claim(self, command: CommittedCommand) -> bool:
        """Whether ``command`` takes a Redis claim (a write, with the fast path on)."""
        return self._claims is not None and not plain_read(command, self._catalog.get(command.tool))

    async def claim_many(self, commands: Sequence[CommittedCommand]) -> list[Claim]:
        """The Redis claims of ``commands`` in one round trip (claims of distinct operations
        only: a second command of the same operation claims when its turn comes)."""
        if self._claims is None:
            return [Claim(kind=ClaimKind.UNAVAILABLE) for _ in commands]
        return await self._claims.claim_many(
            [
                ClaimRequest(
                    tenant=c.tenant, idempotency_key=c.idempotency_key, fingerprint=c.fingerprint
                )
                for c in commands
            ],
            int(time.time() * 1000),
        )

    async def finish_many(self, finishes: Sequence[ClaimFinish]) -> None:
        """Finish deferred claims (``execute(..., defer_finish=True)``) in one round trip."""
        if self._claims is not None and finishes:
            await self._claims.finish_many(finishes)

    async def execute(
        self,
        command: CommittedCommand,
        *,
        trace_id: str | None,
        claim: Claim | None = None,
        defer_finish: bool = False,
    ) -> Execution:
        """Run ``command`` at most once in effect; return its one terminal outcome.

        ``claim``: its Redis claim taken ahead (``claim_many``); a busy one is waited for
        here as usual. ``defer_finish``: the claim is not finished here but returned in
        ``Execution.claim_finish``, for the caller to finish once the outcome is recorded
        (it is, before this returns: the ledger has it, so a claim left running only sends
        a repeat to the ledger)."""
        if plain_read(command, self._catalog.get(command.tool)):
            return await self._read(command, trace_id)
        if claim is None or claim.kind is ClaimKind.BUSY:
            claim = await self._claim(command)
        if claim.kind is ClaimKind.DONE and claim.outcome is not None:
            return Execution(outcome=self._readdressed(claim.outcome, command))
        if claim.kind is ClaimKind.CONFLICT:
            return Execution(outcome=self._failed(command, ErrorCode.CONFLICT, trace_id))
        try:
            first, pending = await self._in_ledger(command, claim, trace_id)
            if first.pending_fence is not None:
                first = await self._settle_in_flight(command, first)
            if pending is not None:
                self._crash_points.reached(CrashPoint.BEFORE_EFFECT)
                first = await self._perform(command, pending, trace_id)
        except DownstreamUnavailable as exc:
            # Refused before the effect was prepared: the ledger transaction rolled back.
            await self._release(command, claim)
            return self._unavailable(command, exc, trace_id)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            # The connection was lost: the open transaction rolled back; nothing is recorded
            # that did not happen. The command is retried by the caller.
            if self._claims is not None and claim.kind in (ClaimKind.CLAIMED, ClaimKind.EXPIRED):
                await self._claims.release(command.tenant, command.idempotency_key, claim.fence)
            raise StorageUnavailable() from exc
        finish = self.finish_of(command, claim, first)
        if finish is not None:
            if defer_finish:
                return replace(first, claim_finish=finish)
            await self.finish_many([finish])
        return first

    def finish_of(
        self, command: CommittedCommand, claim: Claim, execution: Execution
    ) -> ClaimFinish | None:
        """The claim to finish with ``execution``'s outcome (None: no fast path, or the
        outcome is not final yet)."""
        if self._claims is None or execution.outcome.status is Status.UNKNOWN or execution.released:
            return None
        return ClaimFinish(
            tenant=command.tenant,
            idempotency_key=command.idempotency_key,
            fence=claim.fence,
            outcome=execution.outcome,
        )

    async def _release(self, command: CommittedCommand, claim: Claim) -> None:
        """Give back a claim under which nothing was recorded, so a retry runs at once."""
        if self._claims is not None and claim.kind in (ClaimKind.CLAIMED, ClaimKind.EXPIRED):
            await self._claims.release(command.tenant, command.idempotency_key, claim.fence)

    @staticmethod
    def _unavailable(
        command: CommittedCommand, exc: DownstreamUnavailable, trace_id: str | None
    ) -> Execution:
        return Execution(
            outcome=unavailable_outcome(command, exc.retry_after, trace_id), released=True
        )

    def _breaker_of(self, tool: Tool) -> str | None:
        """The breaker judging ``tool``'s calls (reads and writes apart), or None."""
        if self._breakers is None:
            return None
        downstream = downstream_of(self._catalog, tool)
        if downstream is None:
            return None
        return breaker_name(downstream, read=tool.effect is Effect.READ)

    async def _through_breaker(self, tool: Tool) -> Ticket | None:
        """The breaker's ticket for a call of ``tool`` about to start its effect; raises
        `DownstreamUnavailable` while it is open (nothing started yet)."""
        name = self._breaker_of(tool)
        if name is None or self._breakers is None:
            return None
        ticket = await self._breakers.admit(name)
        if not ticket.allowed:
            raise DownstreamUnavailable(ticket.retry_after or 0.0)
        return ticket

    async def _read(self, command: CommittedCommand, trace_id: str | None) -> Execution:
        """A read has no effect to deduplicate: no claim, no ledger row. It runs the same
        commit-time re-check and handler on one connection and is audited like any command;
        asked again (same idempotency key), it answers with the data of that moment
        (docs/execution.md, "Reads")."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                ended, _ = await self._run(conn, command, 0, trace_id)  # no external effect
                await self._audit_executed(conn, command, ended.outcome, kind=AuditKind.READ)
        except DownstreamUnavailable as exc:
            return self._unavailable(command, exc, trace_id)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StorageUnavailable() from exc
        count_dedup("ledger", "skipped_read")
        return ended

    async def _claim(self, command: CommittedCommand) -> Claim:
        """The Redis claim; waits (bounded by the lease) while a live owner holds it."""
        if self._claims is None:
            return Claim(kind=ClaimKind.UNAVAILABLE)
        deadline = time.monotonic() + self._claims.lease_ms / 1000 + 1
        dead_owner: str | None = None
        while True:
            claim = await self._claims.claim(
                command.tenant,
                command.idempotency_key,
                command.fingerprint,
                int(time.time() * 1000),
                dead_owner=dead_owner,
            )
            if claim.kind is not ClaimKind.BUSY or time.monotonic() > deadline:
                return claim
            holder = claim.previous_owner
            if holder and holder != dead_owner and not await self._claims.owner_alive(holder):
                # A killed executor holds it: take it over now rather than after its lease.
                dead_owner = holder
                continue
            await asyncio.sleep(0.1)

    async def _in_ledger(
        self, command: CommittedCommand, claim: Claim, trace_id: str | None
    ) -> tuple[Execution, _Pending | None]:
        async with self._pool.connection() as conn, conn.transaction():
            if not await self._ledger.claim(conn, command, fencing=claim.fence):
                return await self._answer_from_ledger(conn, command, trace_id), None
            count_dedup("ledger", "claimed")
            ended, pending = await self._run(conn, command, claim.fence, trace_id)
            if pending is None:
                await self._record(conn, command, ended)
            return ended, pending

    async def _answer_from_ledger(
        self, conn: Connection, command: CommittedCommand, trace_id: str | None
    ) -> Execution:
        entry = await self._ledger.entry_for_update(conn, command)
        if entry is None:  # ledger rows are never deleted; a vanished row is a storage fault
            raise StorageUnavailable()
        verdict = dedup_decision(
            stored_fingerprint=entry.fingerprint,
            stored_status=entry.status,
            fingerprint=command.fingerprint,
        )
        count_dedup("ledger", verdict.value)
        if verdict is Dedup.CONFLICT:
            return Execution(outcome=self._failed(command, ErrorCode.CONFLICT, trace_id))
        if verdict is Dedup.REPLAY and entry.outcome is not None:
            return Execution(outcome=self._readdressed(entry.outcome, command))
        # Started before and not finished: the effect may have happened. Never re-run it.
        pending = entry.status == LedgerStatus.EFFECT_PENDING
        if not pending:
            # Answered `unknown` now: this call is owed the settlement (entry locked).
            await self._ledger.await_settlement(conn, command, trace_id=trace_id)
        return Execution(
            outcome=self._failed(command, ErrorCode.TIMEOUT, trace_id),
            unknown=True,
            pending_fence=entry.fencing if pending else None,
        )

    async def _settle_in_flight(self, command: CommittedCommand, first: Execution) -> Execution:
        """Another owner's effect is pending in the ledger (a rebalance handed us its
        command while it still works on it, or it died). Wait for it within the claim
        lease; if it does not finish, mark the entry unknown — its late result will be
        refused — and hand the operation to reconciliation."""
        deadline = time.monotonic() + self._wait_for_owner
        fence = first.pending_fence
        while True:
            async with self._pool.connection() as conn, conn.transaction():
                entry = await self._ledger.entry_for_update(conn, command)
                if entry is None:
                    raise StorageUnavailable()
                if entry.status != LedgerStatus.EFFECT_PENDING or entry.fencing != fence:
                    if entry.outcome is not None and entry.status != LedgerStatus.UNKNOWN:
                        return Execution(outcome=self._readdressed(entry.outcome, command))
                    await self._ledger.await_settlement(
                        conn, command, trace_id=first.outcome.trace_id
                    )
                    return replace(first, pending_fence=None)
                if time.monotonic() >= deadline:
                    await self._ledger.mark_unknown(
                        conn, command, fencing=entry.fencing, outcome=first.outcome
                    )
                    await self._ledger.await_settlement(
                        conn, command, trace_id=first.outcome.trace_id
                    )
                    log.warning(
                        "operation %s left pending by another owner: unknown",
                        command.operation_id,
                    )
                    return replace(first, pending_fence=None)
            await asyncio.sleep(0.2)

    async def _record(self, conn: Connection, command: CommittedCommand, ended: Execution) -> None:
        outcome = ended.outcome
        await self._ledger.record(conn, command, outcome)
        if ended.budgeted:
            await self._settle_budgets(conn, command, outcome)
        await self._audit_executed(conn, command, outcome)

    async def _settle_budgets(
        self, conn: Connection, command: CommittedCommand, outcome: Outcome
    ) -> None:
        """The reservations follow the recorded outcome: consumed, released, or kept while
        it is unknown."""
        await self._budgets.settle(
            conn, tenant=command.tenant, operation_id=command.operation_id, status=outcome.status
        )

    async def _audit_executed(
        self,
        conn: Connection,
        command: CommittedCommand,
        outcome: Outcome,
        kind: AuditKind = AuditKind.EXECUTED,
    ) -> None:
        await self._ledger.audit(
            conn,
            tenant=command.tenant,
            call_id=command.call_id,
            kind=kind,
            detail=executed_detail(command, outcome),
        )

    async def _run(
        self, conn: Connection, command: CommittedCommand, fence: int, trace_id: str | None
    ) -> tuple[Execution, _Pending | None]:
        tool = self._catalog.get(command.tool)
        if tool is None:
            return Execution(outcome=self._failed(command, ErrorCode.UNKNOWN_TOOL, trace_id)), None
        admitted = admission(
            command,
            tool,
            cancelled=self._cancelled,
            now=datetime.now(UTC),
            keys=self._receipt_keys,
        )
        if isinstance(admitted, ErrorCode):
            return Execution(outcome=self._failed(command, admitted, trace_id)), None
        actor, arguments = admitted.actor, admitted.arguments
        # Commit-time re-check on fresh, locked state with the tenant in the WHERE.
        resource = await tool.load(conn, actor, arguments, True) if tool.load else None
        if command_freeze(self._freezes.current, command, resource) is not None:  # kill switch
            return Execution(outcome=self._failed(command, ErrorCode.FROZEN, trace_id)), None
        loaded = Loaded(command=command, tool=tool, admitted=admitted, resource=resource)
        policies = self._policies.current
        (refusal,) = resource_refusals([loaded], policies)
        if refusal is not None:
            return Execution(outcome=self._failed(command, refusal, trace_id)), None
        # The tenant's budgets: its own where one replaces the default (docs/budgets.md).
        in_force = policies.budgets_for(command.tenant) if policies.budgets else ()
        budgeted = bool(in_force) and not plain_read(command, tool)
        if budgeted:
            # The authoritative budget check: the window locked, summed and the amount
            # reserved in this transaction, the one that inserts the ledger entry.
            exceeded = await self._budgets.reserve(
                conn,
                in_force,
                tenant=command.tenant,
                operation_id=command.operation_id,
                agent=actor.sub,
                subject=resource_owner(resource),
                tool=command.tool,
                arguments=command.arguments,
            )
            if exceeded is not None:
                return Execution(
                    outcome=self._over_budget(command, exceeded, trace_id), budgeted=True
                ), None
        context = ExecutionContext(
            conn=conn,
            operation_id=command.operation_id,
            tenant=command.tenant,
            actor=actor,
            arguments=arguments,
            resource=resource,
        )
        ended, pending = await self._handle(command, tool, context, fence, trace_id)
        if not budgeted:
            return ended, pending
        return replace(ended, budgeted=True), (
            replace(pending, budgeted=True) if pending is not None else None
        )

    def _over_budget(
        self, command: CommittedCommand, exceeded: BudgetExceeded, trace_id: str | None
    ) -> Outcome:
        log.info(
            "operation %s over budget %s (remaining %d, needs %d)",
            command.operation_id,
            exceeded.budget,
            exceeded.remaining,
            exceeded.requested,
        )
        return self._outcome(
            command,
            status=Status.DENIED,
            trace_id=trace_id,
            error=ErrorInfo.of(ErrorCode.BUDGET_EXCEEDED, exceeded.message()),
        )

    async def _handle(
        self,
        command: CommittedCommand,
        tool: Tool,
        context: ExecutionContext,
        fence: int,
        trace_id: str | None,
    ) -> tuple[Execution, _Pending | None]:
        conn = context.conn
        # The downstream's breaker, before anything of the effect starts: open, it raises
        # and the caller's transaction (the ledger entry with it) rolls back.
        ticket = await self._through_breaker(tool)
        started = time.monotonic()
        try:
            # A savepoint: a failing handler's domain writes roll back, the ledger row stays.
            async with conn.transaction():
                handled = await tool.handler(context)
        except RatifierError as exc:
            if ticket is not None and tool.external is None:
                failed = isinstance(exc, (TransientFailure, OutcomeUnknown))
                await self._count(ticket, ok=not failed, started=started)
            return Execution(outcome=self._refused(command, exc, trace_id)), None
        except psycopg.OperationalError:
            raise
        except psycopg.Error:
            log.exception("handler %s failed on the database", tool.name)
            return Execution(
                outcome=self._failed(command, ErrorCode.PERMANENT_ERROR, trace_id)
            ), None
        if tool.external is None:
            if ticket is not None:  # a read (or internal write) that depends on a downstream
                await self._count(ticket, ok=True, started=started)
            return Execution(
                outcome=self._outcome(
                    command,
                    status=Status.SUCCEEDED,
                    result=handled.result,
                    resource_id=handled.resource_id,
                    trace_id=trace_id,
                )
            ), None
        await self._ledger.mark_effect_pending(conn, command, fencing=fence, effect=handled.result)
        request = EffectRequest(
            operation_id=command.operation_id, tenant=command.tenant, payload=handled.result
        )
        placeholder = Execution(
            outcome=self._failed(command, ErrorCode.TIMEOUT, trace_id), unknown=True
        )
        pending = _Pending(
            request=request,
            external=tool.external,
            fence=fence,
            ticket=ticket,
            resource=context.resource,
        )
        return placeholder, pending

    async def _count(self, ticket: Ticket, *, ok: bool, started: float) -> None:
        if self._breakers is not None:
            await self._breakers.record(ticket, ok=ok, seconds=time.monotonic() - started)

    async def _perform(
        self, command: CommittedCommand, pending: _Pending, trace_id: str | None
    ) -> Execution:
        """Invoke the external effect, then settle, release or mark unknown — once, if the
        entry is still ours."""
        invoked = await self._invoke(command, pending, trace_id)
        async with self._pool.connection() as conn, conn.transaction():
            done = await self._settle(conn, command, pending, invoked, trace_id)
        self._crash_points.reached(CrashPoint.AFTER_LEDGER)
        return done

    async def _invoke(
        self, command: CommittedCommand, pending: _Pending, trace_id: str | None
    ) -> _Invoked:
        """Invoke the external effect (bounded retries only for failures known to precede
        it); what it answered, as the outcome to record."""
        if command_freeze(self._freezes.current, command, pending.resource) is not None:
            # Frozen since the commit-time check (the kill switch): the effect never starts;
            # the prepared effect is released like any failure known to precede it.
            frozen = self._failed(command, ErrorCode.FROZEN, trace_id)
            return _Invoked(outcome=frozen, done=None, code=ErrorCode.FROZEN)
        external, request = pending.external, pending.request
        done: HandlerResult | None = None
        code: ErrorCode | None = None
        refusal: PermanentFailure | None = None
        ticket = pending.ticket
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self._retry_attempts),
                wait=wait_exponential_jitter(multiplier=0.1, max=2.0),
                retry=retry_if_exception_type(TransientFailure),
                reraise=False,
            ):
                with attempt:
                    done = await self._attempt(external, request, ticket, attempt.retry_state)
        except RetryError:
            code = ErrorCode.RETRY_EXHAUSTED
        except _RetriesCut:
            # The breaker opened while this call waited to retry a failure known to precede
            # its effect: no further attempt while it is open; its retries end here.
            code = ErrorCode.RETRY_EXHAUSTED
        except PermanentFailure as exc:
            code, refusal = ErrorCode.PERMANENT_ERROR, exc
        except OutcomeUnknown:
            code = ErrorCode.TIMEOUT
        self._crash_points.reached(CrashPoint.AFTER_EFFECT)
        if done is not None:
            outcome = self._outcome(
                command,
                status=Status.SUCCEEDED,
                result=done.result,
                resource_id=done.resource_id,
                trace_id=trace_id,
            )
        elif refusal is not None:
            outcome = self._refused(command, refusal, trace_id)
        else:
            assert code is not None
            outcome = self._failed(command, code, trace_id)
        return _Invoked(outcome=outcome, done=done, code=code)

    async def _attempt(
        self,
        external: ExternalEffect,
        request: EffectRequest,
        ticket: Ticket | None,
        state: RetryCallState,
    ) -> HandlerResult:
        """One attempt of the effect, its result counted by the downstream's breaker (a
        failure: known not applied, or its outcome unknown). A retry is attempted only while
        the breaker is not open."""
        if ticket is None or self._breakers is None:
            return await external.invoke(request)
        if state.attempt_number > 1 and not await self._breakers.still_closed_enough(ticket):
            raise _RetriesCut()
        started = time.monotonic()
        try:
            done = await external.invoke(request)
        except (TransientFailure, OutcomeUnknown):
            await self._count(ticket, ok=False, started=started)
            raise
        except PermanentFailure:
            await self._count(ticket, ok=True, started=started)  # it answered: a refusal
            raise
        await self._count(ticket, ok=True, started=started)
        return done

    async def _settle(
        self,
        conn: Connection,
        command: CommittedCommand,
        pending: _Pending,
        invoked: _Invoked,
        trace_id: str | None,
    ) -> Execution:
        """Record what the effect answered, in ``conn``'s transaction: settle, release or
        mark unknown, if the entry is still ours (its fence); else only note the late
        result."""
        external, request = pending.external, pending.request
        outcome, done, code = invoked.outcome, invoked.done, invoked.code
        if code is ErrorCode.TIMEOUT:
            finished = await self._ledger.finish_effect(
                conn,
                command,
                fencing=pending.fence,
                outcome=outcome.model_copy(update={"status": Status.UNKNOWN}),
            )
            if finished:
                await self._ledger.await_settlement(conn, command, trace_id=trace_id)
        else:
            finished = await self._ledger.finish_effect(
                conn, command, fencing=pending.fence, outcome=outcome
            )
            if finished and done is not None:
                await external.settle(conn, request, done)
            elif finished:
                await external.release(conn, request)
            if finished and pending.budgeted:
                await self._settle_budgets(conn, command, outcome)
        if not finished:
            # Someone else settled it meanwhile (reconciler, a later owner): the ledger's
            # record stands; this late result is only noted.
            entry = await self._ledger.entry_for_update(conn, command)
            await self._ledger.audit(
                conn,
                tenant=command.tenant,
                call_id=command.call_id,
                kind=AuditKind.LATE_RESULT,
                detail={
                    "operation_id": command.operation_id,
                    "late_status": outcome.status.value,
                    "ledger_status": entry.status if entry else None,
                },
            )
            if (
                entry is not None
                and entry.outcome is not None
                and entry.status != LedgerStatus.UNKNOWN
            ):
                return Execution(outcome=self._readdressed(entry.outcome, command))
            await self._ledger.await_settlement(conn, command, trace_id=trace_id)
            return Execution(
                outcome=outcome.model_copy(update={"status": Status.UNKNOWN}), unknown=True
            )
        await self._audit_executed(conn, command, outcome)
        return Execution(outcome=outcome, unknown=code is ErrorCode.TIMEOUT)

    # -- group commit -----------------------------------------------------------------------

    async def execute_group(self, members: Sequence[GroupMember]) -> list[Execution | None]:
        """Run the first transaction of several write commands (distinct operations) as one:
        each in its own savepoint, one commit for all; then their external effects
        concurrently; then their settlements in one more transaction (docs/execution.md,
        "Group commit"). The fencing, the commit-time re-check and the crash guarantees are
        those of :meth:`execute`: only the number of commits changes.

        A member answers ``None`` when it must run alone (:meth:`execute`): its operation is
        already in the ledger (a repeat, or another owner's), or its savepoint failed
        (a deadlock, a bug); nothing of it is committed then. A lost connection fails the
        group: ``StorageUnavailable``, nothing of the failed transaction committed."""
        results: list[Execution | None] = [None] * len(members)
        pending: dict[int, _Pending] = {}
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await self._ledger.group_lock_timeout(conn)
                for i, member in enumerate(members):
                    ran = await self._in_group(conn, member)
                    if ran is not None:
                        results[i], found = ran
                        if found is not None:
                            pending[i] = found
                self._crash_points.reached(CrashPoint.GROUP_PREPARED)
            self._crash_points.reached(CrashPoint.GROUP_COMMITTED)
            for member, result in zip(members, results, strict=True):
                if result is not None and result.released:  # refused by an open breaker
                    await self._release(member.command, member.claim)
            if not pending:
                return results
            at = list(pending)
            for _ in at:  # as often as one by one: crash tests kill with a probability
                self._crash_points.reached(CrashPoint.BEFORE_EFFECT)
            # No connection is held while the effects run (they may hang until a timeout).
            invoked = await asyncio.gather(
                *(self._invoke(members[i].command, pending[i], members[i].trace_id) for i in at)
            )
            alone: list[int] = []
            async with self._pool.connection() as conn, conn.transaction():
                await self._ledger.group_lock_timeout(conn)
                for i, answer in zip(at, invoked, strict=True):
                    settled = await self._settle_in_group(conn, members[i], pending[i], answer)
                    if settled is None:
                        alone.append(i)
                    results[i] = settled
            # Settled alone only after the group's commit: its locks are released by then.
            for i, answer in zip(at, invoked, strict=True):
                if i in alone:
                    async with self._pool.connection() as conn, conn.transaction():
                        results[i] = await self._settle(
                            conn, members[i].command, pending[i], answer, members[i].trace_id
                        )
            for _ in at:
                self._crash_points.reached(CrashPoint.AFTER_LEDGER)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StorageUnavailable() from exc
        return results

    async def _in_group(
        self, conn: Connection, member: GroupMember
    ) -> tuple[Execution, _Pending | None] | None:
        """One member's ledger work in its savepoint; None: run it alone."""
        command, fence = member.command, member.claim.fence
        try:
            async with conn.transaction():
                if not await self._ledger.claim(conn, command, fencing=fence):
                    return None  # in the ledger already: answered alone, from the ledger
                count_dedup("ledger", "claimed")
                ended, pending = await self._run(conn, command, fence, member.trace_id)
                if pending is None:
                    await self._record(conn, command, ended)
                return ended, pending
        except DownstreamUnavailable as exc:
            # The breaker is open: the savepoint took this member's ledger entry back.
            return self._unavailable(command, exc, member.trace_id), None
        except _LOCK_CONFLICTS as exc:
            # A row lock held by another transaction (lock timeout, deadlock, serialization):
            # the savepoint released this member's locks; it runs alone after the group.
            log.info("operation %s in its group: %s; run alone", command.operation_id, exc.sqlstate)
            return None
        except psycopg.OperationalError:
            raise
        except Exception:
            log.exception("operation %s failed in its group; run alone", command.operation_id)
            return None

    async def _settle_in_group(
        self, conn: Connection, member: GroupMember, pending: _Pending, invoked: _Invoked
    ) -> Execution | None:
        """One member's settlement in its savepoint; None: it failed there (not a lost
        connection) and is settled in a transaction of its own after the group's, so one
        member cannot undo another's record."""
        command, trace_id = member.command, member.trace_id
        try:
            async with conn.transaction():
                return await self._settle(conn, command, pending, invoked, trace_id)
        except _LOCK_CONFLICTS as exc:
            log.info("settling %s in its group: %s; alone", command.operation_id, exc.sqlstate)
        except psycopg.OperationalError:
            raise
        except psycopg.Error:
            log.exception("settling %s in its group failed; alone", command.operation_id)
        return None
