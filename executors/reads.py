"""The plain reads of one poll batch, run together (docs/execution.md, "Reads").

A read has no effect to deduplicate (no claim, no ledger entry), so the reads of a batch can
share one connection and one transaction: per read, the same commit-time re-check as a
single command's (`executors.decisions`: `admission`, then `resource_refusals`, one policy
evaluation for the batch); per tenant and tool, one query for the resources of all its reads
(`commands.catalog.load_resources` with `Tool.load_many`; a tool without one is loaded read by
read on the same connection);
then each read's handler; then every read's audit row (kind `read`) in one statement, and
one commit.

One read's refusal or handler refusal ends that read alone, with its own typed outcome. A
database error inside the transaction aborts it for every read of the batch: nothing is
recorded, storage errors raise `StorageUnavailable` (the caller waits and retries the
batch), any other error reaches the caller, which runs these reads one by one instead.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from approvals.signing import ApprovalKeys
from commands.catalog import (
    Catalog,
    Connection,
    ExecutionContext,
    Tool,
    downstream_of,
    load_resources,
)
from commands.freezes import FixedFreezes, FreezeSource
from commands.policy import PolicySet, PolicySource
from executors.decisions import (
    Admitted,
    Loaded,
    admission,
    command_freeze,
    plain_read,
    resource_refusals,
)
from executors.executor import Execution
from executors.ledger import CommandLedger
from executors.outcomes import (
    executed_detail,
    failed_outcome,
    outcome_of,
    refused_outcome,
    unavailable_outcome,
)
from runtime.breakers import FleetBreakers, breaker_name
from runtime.turns import turn
from schemas.envelopes import CommittedCommand, Outcome, Status
from schemas.errors import (
    ErrorCode,
    OutcomeUnknown,
    RatifierError,
    StorageUnavailable,
    TransientFailure,
)
from schemas.vocabulary import AuditKind
from telemetry.metrics import count_dedup

# Reads handled between yield points (another lane's few records run there).
YIELD_EVERY = 25


@dataclass(frozen=True, kw_only=True)
class Read:
    """One read command of a batch, with the trace it is answered in."""

    command: CommittedCommand
    trace_id: str | None


def split_reads(
    commands: Sequence[CommittedCommand | None], catalog: Catalog
) -> tuple[list[int], list[int]]:
    """The positions of the plain reads of a batch (run together) and of the rest (run one
    by one, in order per key), each in batch order. An unreadable record (None) is in the
    rest, where it is answered as before."""
    reads: list[int] = []
    rest: list[int] = []
    for index, command in enumerate(commands):
        is_read = command is not None and plain_read(command, catalog.get(command.tool))
        (reads if is_read else rest).append(index)
    return reads, rest


@dataclass(frozen=True, kw_only=True)
class _Admitted:
    read: Read
    tool: Tool
    admitted: Admitted


class BatchedReads:
    """Runs the plain reads of a batch in one transaction (see the module's docstring)."""

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        catalog: Catalog,
        policies: PolicySource,
        receipt_keys: ApprovalKeys,
        cancelled: Container[str] = frozenset(),
        freezes: FreezeSource | None = None,
        breakers: FleetBreakers | None = None,
    ) -> None:
        self._freezes = freezes or FixedFreezes()
        # A read tool that names a downstream is judged by its read breaker (writes apart).
        self._breakers = breakers
        self._pool = pool
        self._catalog = catalog
        self._policies = policies
        self._receipt_keys = receipt_keys
        self._cancelled = cancelled
        self._ledger = CommandLedger()
        # Batched transactions committed by this instance (tests and measurements read it).
        self.transactions = 0

    async def execute(self, reads: Sequence[Read]) -> list[Execution]:
        """Each read's one outcome, in the order of ``reads``, all audited and committed in
        one transaction."""
        if not reads:
            return []
        try:
            async with self._pool.connection() as conn, conn.transaction():
                outcomes = await self._run(conn, reads, self._policies.current)
                await self._ledger.audit_many(
                    conn,
                    [
                        (r.command.tenant, r.command.call_id, executed_detail(r.command, o))
                        for r, o in zip(reads, outcomes, strict=True)
                    ],
                    kind=AuditKind.READ,
                )
        except (psycopg.OperationalError, PoolTimeout) as exc:
            # The transaction rolled back: nothing of the batch is recorded; retry it whole.
            raise StorageUnavailable() from exc
        self.transactions += 1
        for _ in reads:
            count_dedup("ledger", "skipped_read")
        return [Execution(outcome=outcome) for outcome in outcomes]

    async def _run(
        self, conn: Connection, reads: Sequence[Read], policies: PolicySet
    ) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(reads)
        now = datetime.now(UTC)
        admitted: list[tuple[int, _Admitted]] = []
        for index, read in enumerate(reads):
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await turn()
            tool = self._catalog.get(read.command.tool)
            if tool is None:
                outcomes[index] = failed_outcome(
                    read.command, ErrorCode.UNKNOWN_TOOL, read.trace_id
                )
                continue
            verdict = admission(
                read.command, tool, cancelled=self._cancelled, now=now, keys=self._receipt_keys
            )
            if isinstance(verdict, ErrorCode):
                outcomes[index] = failed_outcome(read.command, verdict, read.trace_id)
                continue
            admitted.append((index, _Admitted(read=read, tool=tool, admitted=verdict)))
        # Reads lock nothing: a read's snapshot is the data of that moment.
        resources = await load_resources(
            conn,
            [(item.tool, item.admitted.actor, item.admitted.arguments) for _, item in admitted],
        )
        loaded = [
            Loaded(command=item.read.command, tool=item.tool, admitted=item.admitted, resource=r)
            for (_, item), r in zip(admitted, resources, strict=True)
        ]
        refusals = resource_refusals(loaded, policies)
        view = self._freezes.current  # the kill switch, at commit time
        for i, found in enumerate(loaded):
            if command_freeze(view, found.command, found.resource) is not None:
                refusals[i] = ErrorCode.FROZEN
        for n, ((index, item), found, refusal) in enumerate(
            zip(admitted, loaded, refusals, strict=True), 1
        ):
            if n % YIELD_EVERY == 0:
                await turn()
            if refusal is not None:
                outcomes[index] = failed_outcome(item.read.command, refusal, item.read.trace_id)
            else:
                outcomes[index] = await self._handle(conn, item.read, found)
        return [outcome for outcome in outcomes if outcome is not None]

    async def _handle(self, conn: Connection, read: Read, loaded: Loaded) -> Outcome:
        command = read.command
        context = ExecutionContext(
            conn=conn,
            operation_id=command.operation_id,
            tenant=command.tenant,
            actor=loaded.admitted.actor,
            arguments=loaded.admitted.arguments,
            resource=loaded.resource,
        )
        downstream = downstream_of(self._catalog, loaded.tool)
        ticket = None
        if downstream is not None and self._breakers is not None:
            ticket = await self._breakers.admit(breaker_name(downstream, read=True))
            if not ticket.allowed:  # open: the read is not attempted
                return unavailable_outcome(command, ticket.retry_after, read.trace_id)
        started = time.monotonic()
        # No savepoint per read: a read handler has no writes to roll back, and a database
        # error aborts the whole transaction anyway (the caller then runs the reads alone).
        try:
            handled = await loaded.tool.handler(context)
        except RatifierError as exc:
            if ticket is not None and self._breakers is not None:
                failed = isinstance(exc, (TransientFailure, OutcomeUnknown))
                await self._breakers.record(
                    ticket, ok=not failed, seconds=time.monotonic() - started
                )
            return refused_outcome(command, exc, read.trace_id)
        if ticket is not None and self._breakers is not None:
            await self._breakers.record(ticket, ok=True, seconds=time.monotonic() - started)
        return outcome_of(
            command,
            status=Status.SUCCEEDED,
            result=handled.result,
            resource_id=handled.resource_id,
            trace_id=read.trace_id,
        )
