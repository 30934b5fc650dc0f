"""Budget reservations in PostgreSQL, inside the executor's commit transaction.

For each budget a command falls under: lock the window's row, sum what counts in the window
(reserved or consumed), decide (`commands.budgets.budget_decision`), insert the reservation
keyed by operation id. The ledger entry is inserted in the same transaction, so a crash
before the commit leaves neither and a redelivery finds both. The reservation then follows
the operation's outcome (:meth:`BudgetBook.settle`): succeeded → consumed; refused or failed
→ released; unknown → kept until reconciliation settles it (docs/budgets.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from commands.budgets import (
    Budget,
    BudgetExceeded,
    budget_decision,
    resets_at,
    window_of,
)
from commands.catalog import Connection
from commands.sql import named_query
from schemas.envelopes import Status

_PKG = __name__.rpartition(".")[0]


class UsageState:
    RESERVED = "reserved"
    CONSUMED = "consumed"
    RELEASED = "released"


def settled_state(status: Status) -> str | None:
    """What an outcome does to the operation's reservations: None keeps them reserved (the
    outcome is not known yet)."""
    if status in (Status.UNKNOWN, Status.AWAITING_APPROVAL):
        return None
    return UsageState.CONSUMED if status is Status.SUCCEEDED else UsageState.RELEASED


@dataclass(frozen=True, kw_only=True)
class _Charge:
    budget: Budget
    scope_key: str
    amount: int


@dataclass(frozen=True, kw_only=True)
class WindowUsage:
    """One scope's window of a budget, for `ratifier budgets`."""

    budget: Budget
    tenant: str
    scope_key: str
    window_key: str
    consumed: int
    reserved: int
    resets_at: datetime | None

    @property
    def used(self) -> int:
        return self.consumed + self.reserved


class BudgetBook:
    """Budget operations on a connection inside the caller's transaction."""

    async def reserve(
        self,
        conn: Connection,
        budgets: Sequence[Budget],
        *,
        tenant: str,
        operation_id: str,
        agent: str,
        subject: str | None,
        tool: str,
        arguments: Mapping[str, Any],
    ) -> BudgetExceeded | None:
        """Reserve this operation's amount in every budget it falls under, or refuse with
        the first budget it would take over its cap (then nothing of it is reserved: the
        caller's transaction writes a refusal, and the reservations made so far are
        released by it)."""
        charges = [
            _Charge(
                budget=b, scope_key=b.scope_key(agent=agent, subject=subject, tool=tool), amount=a
            )
            for b in budgets
            if (a := b.amount_of(tool, arguments)) is not None
        ]
        if not charges:
            return None
        async with conn.cursor() as cur:
            await cur.execute(named_query(_PKG, "budget_now"))
            row = await cur.fetchone()
            assert row is not None
            now: datetime = row["now"]
            # One lock order (budget name, then scope) for every transaction: no deadlocks
            # between executors charging the same budgets.
            for charge in sorted(charges, key=lambda c: (c.budget.name, c.scope_key)):
                budget, span = charge.budget, window_of(charge.budget, now)
                key = {
                    "tenant": tenant,
                    "budget": budget.name,
                    "scope_key": charge.scope_key,
                    "window_key": span.key,
                }
                await cur.execute(named_query(_PKG, "budget_lock_window"), key)
                await cur.execute(
                    named_query(_PKG, "budget_window_usage"),
                    {**key, "since": span.since, "operation_id": operation_id},
                )
                usage = await cur.fetchone()
                assert usage is not None
                if usage["ours"]:
                    continue  # reserved by this operation already: never counted twice
                exceeded = budget_decision(
                    budget,
                    used=int(usage["used"]),
                    amount=charge.amount,
                    resets=resets_at(budget, span, usage["oldest"]),
                )
                if exceeded is not None:
                    return exceeded
                await cur.execute(
                    named_query(_PKG, "budget_reserve"),
                    {
                        **key,
                        "operation_id": operation_id,
                        "amount": charge.amount,
                        "reserved_at": now,
                    },
                )
        return None

    async def settle(
        self, conn: Connection, *, tenant: str, operation_id: str, status: Status
    ) -> int:
        """Consume or release the operation's reservations by its outcome's status (kept
        while it is unknown); how many moved."""
        state = settled_state(status)
        if state is None:
            return 0
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "budget_settle"),
                {"tenant": tenant, "operation_id": operation_id, "state": state},
            )
            return len(await cur.fetchall())

    async def usage(
        self, conn: Connection, budget: Budget, *, tenant: str, now: datetime
    ) -> list[WindowUsage]:
        """The current window of ``budget`` for each scope of ``tenant`` that has usage."""
        span = window_of(budget, now)
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "budget_usage_list"),
                {
                    "tenant": tenant,
                    "budget": budget.name,
                    "window_key": span.key,
                    "since": span.since,
                },
            )
            rows = await cur.fetchall()
        return [
            WindowUsage(
                budget=budget,
                tenant=r["tenant"],
                scope_key=r["scope_key"],
                window_key=span.key,
                consumed=int(r["consumed"]),
                reserved=int(r["reserved"]),
                resets_at=resets_at(budget, span, r["oldest"]),
            )
            for r in rows
        ]
