"""Executing one committed command: dedup, ledger, commit-time re-check, handler.

The whole of an internal effect happens in one PostgreSQL transaction together with the
ledger entry, so a command either ran once (and its outcome is stored) or not at all.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from commands.catalog import Catalog, Connection, ExecutionContext, Tool
from commands.policy import PolicySource, authorize
from executors.decisions import Dedup, dedup_decision, receipt_problem, status_for
from executors.dedup import CachedOutcome, OutcomeCache
from executors.ledger import CommandLedger
from schemas.envelopes import Actor, CommittedCommand, ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode, RatifierError, StorageUnavailable

log = logging.getLogger("ratifier.executor")


class CommandExecutor:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        cache: OutcomeCache,
        catalog: Catalog,
        policies: PolicySource,
    ) -> None:
        self._pool = pool
        self._cache = cache
        self._catalog = catalog
        self._policies = policies
        self._ledger = CommandLedger()

    def _outcome(
        self,
        command: CommittedCommand,
        *,
        status: Status,
        code: ErrorCode | None = None,
        result: dict[str, Any] | None = None,
        resource_id: str | None = None,
        trace_id: str | None,
    ) -> Outcome:
        return Outcome(
            call_id=command.call_id,
            tool=command.tool,
            tenant=command.tenant,
            status=status,
            stage=Stage.EXECUTE,
            error=ErrorInfo.of(code) if code is not None else None,
            result=result,
            resource_id=resource_id,
            operation_id=command.operation_id,
            policy_version=command.policy_version,
            approval=command.approval,
            at=datetime.now(UTC),
            trace_id=trace_id,
        )

    def _failed(self, command: CommittedCommand, code: ErrorCode, trace_id: str | None) -> Outcome:
        return self._outcome(command, status=status_for(code), code=code, trace_id=trace_id)

    @staticmethod
    def _readdressed(stored: Outcome, command: CommittedCommand) -> Outcome:
        """The stored outcome of this operation, answered to the call that asked again."""
        return stored.model_copy(update={"call_id": command.call_id})

    async def execute(self, command: CommittedCommand, *, trace_id: str | None) -> Outcome:
        """Run ``command`` at most once in effect and return its one terminal outcome."""
        cached = await self._cache.get(command.tenant, command.idempotency_key)
        if cached is not None:
            if cached.fingerprint != command.fingerprint:
                return self._failed(command, ErrorCode.CONFLICT, trace_id)
            return self._readdressed(cached.outcome, command)
        try:
            outcome, fresh = await self._execute_in_ledger(command, trace_id)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            # Connection lost: the transaction rolled back, nothing happened.
            raise StorageUnavailable() from exc
        if outcome.terminal:
            await self._cache.put(
                command.tenant,
                command.idempotency_key,
                CachedOutcome(fingerprint=command.fingerprint, outcome=outcome),
            )
        if not fresh:
            log.info("operation %s answered from the ledger", command.operation_id)
        return outcome

    async def _execute_in_ledger(
        self, command: CommittedCommand, trace_id: str | None
    ) -> tuple[Outcome, bool]:
        async with self._pool.connection() as conn, conn.transaction():
            if not await self._ledger.claim(conn, command, fencing=0):
                entry = await self._ledger.entry_for_update(conn, command)
                if entry is None:  # claim raced a delete; ledger rows are never deleted
                    raise StorageUnavailable()
                verdict = dedup_decision(
                    stored_fingerprint=entry.fingerprint,
                    stored_status=entry.status,
                    fingerprint=command.fingerprint,
                )
                if verdict is Dedup.CONFLICT:
                    return self._failed(command, ErrorCode.CONFLICT, trace_id), False
                if verdict is Dedup.REPLAY and entry.outcome is not None:
                    return self._readdressed(entry.outcome, command), False
                return self._failed(command, ErrorCode.TIMEOUT, trace_id), False
            outcome = await self._run(conn, command, trace_id)
            await self._ledger.record(conn, command, outcome)
            await self._ledger.audit(
                conn,
                tenant=command.tenant,
                call_id=command.call_id,
                kind="executed",
                detail={
                    "operation_id": command.operation_id,
                    "tool": command.tool,
                    "status": outcome.status.value,
                    "code": outcome.error.code.value if outcome.error else None,
                    "policy_version": command.policy_version,
                },
            )
            return outcome, True

    async def _run(
        self, conn: Connection, command: CommittedCommand, trace_id: str | None
    ) -> Outcome:
        tool = self._catalog.get(command.tool)
        if tool is None:
            return self._failed(command, ErrorCode.UNKNOWN_TOOL, trace_id)
        problem = receipt_problem(command, tool, datetime.now(UTC))
        if problem is not None:
            return self._failed(command, problem, trace_id)
        try:
            arguments = tool.arguments.model_validate(command.arguments, strict=True)
        except ValidationError:
            return self._failed(command, ErrorCode.INVALID_ARGUMENTS, trace_id)
        actor = Actor(sub=command.actor.sub, tenant=command.tenant, roles=command.actor.roles)
        # Commit-time re-check on fresh, locked state with the tenant in the WHERE.
        resource = await tool.load(conn, command.tenant, arguments, True) if tool.load else None
        if tool.load is not None and resource is None:
            return self._failed(command, ErrorCode.NOT_FOUND, trace_id)
        decision = authorize(
            actor=actor,
            tool=tool,
            resource=resource,
            arguments=command.arguments,
            policies=self._policies.current,
        )
        if not decision.permitted:
            return self._failed(command, ErrorCode.PRECONDITION_FAILED, trace_id)
        context = ExecutionContext(
            conn=conn,
            operation_id=command.operation_id,
            tenant=command.tenant,
            actor=actor,
            arguments=arguments,
            resource=resource,
        )
        return await self._invoke(command, tool, context, trace_id)

    async def _invoke(
        self,
        command: CommittedCommand,
        tool: Tool,
        context: ExecutionContext,
        trace_id: str | None,
    ) -> Outcome:
        conn = context.conn
        try:
            # A savepoint: a failing handler's domain writes roll back, the ledger row stays.
            async with conn.transaction():
                handled = await tool.handler(context)
        except RatifierError as exc:
            return self._failed(command, exc.code, trace_id)
        except psycopg.OperationalError:
            raise
        except psycopg.Error:
            log.exception("handler %s failed on the database", tool.name)
            return self._failed(command, ErrorCode.PERMANENT_ERROR, trace_id)
        return self._outcome(
            command,
            status=Status.SUCCEEDED,
            result=handled.result,
            resource_id=handled.resource_id,
            trace_id=trace_id,
        )
