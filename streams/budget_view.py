"""The authorizer's early view of spending budgets: each call's budgets as
``context.budgets`` for Cedar (docs/budgets.md, "Budgets in Cedar policies"), so that a
policy can route a call to a human above, say, 80 % of the day's budget.

Read from the table the executor writes (`budget_usage`), one query per batch for the
windows the cache does not hold, and cached for `BUDGET_VIEW_TTL_SECONDS`: a view that may
be that much older than the batch, and does not see calls authorized but not yet committed.
It never refuses a call: the executor's commit-time check stays the only one that does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from approvals.auto import resource_owner
from commands.budgets import BudgetStanding, budgets_of_tool, window_of
from commands.policy import AuthorizationRequest, PolicySet

# How old a window's usage may be when a call is decided on it (plus the query's own time).
BUDGET_VIEW_TTL_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True, order=True)
class WindowAsk:
    """One window of one budget for one scope: the unit the view reads and caches."""

    tenant: str
    budget: str
    scope_key: str
    window_key: str
    since: datetime


# (used, reserved) of each asked window; a window missing from the answer has no usage.
WindowUsage = tuple[int, int]
WindowsQuery = Callable[[Sequence[WindowAsk]], Awaitable[dict[WindowAsk, WindowUsage]]]


@dataclass(frozen=True, kw_only=True)
class _Charge:
    index: int
    name: str
    cap: int
    window: WindowAsk


def charges_of(
    requests: Sequence[AuthorizationRequest], policies: PolicySet, now: datetime
) -> list[_Charge]:
    """The windows each request's ``context.budgets`` needs: the budgets its action's schema
    declares (none for a schema without ``context.budgets``), in the call's scope."""
    found = []
    for i, request in enumerate(requests):
        declared = set(policies.budget_context.get(request.tool.name, ()))
        # The tenant's budgets: its own where one replaces the default of the same name.
        in_force = policies.budgets_for(request.actor.tenant)
        for budget in budgets_of_tool(in_force, request.tool):
            if budget.name not in declared:
                continue
            span = window_of(budget, now)
            scope = budget.scope_key(
                agent=request.actor.sub,
                subject=resource_owner(request.resource),
                tool=request.tool.name,
            )
            window = WindowAsk(
                tenant=request.actor.tenant,
                budget=budget.name,
                scope_key=scope,
                window_key=span.key,
                since=span.since,
            )
            found.append(_Charge(index=i, name=budget.name, cap=budget.cap, window=window))
    return found


class BudgetView:
    """Budget standings for a batch of authorization requests, from a briefly cached read."""

    def __init__(
        self,
        query: WindowsQuery,
        *,
        ttl_seconds: float = BUDGET_VIEW_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._query = query
        self._ttl = ttl_seconds
        self._clock = clock
        # window → (read at, usage); keyed by the window, so a new day is a new entry.
        self._cache: dict[WindowAsk, tuple[float, WindowUsage]] = {}

    async def with_budgets(
        self, requests: Sequence[AuthorizationRequest], policies: PolicySet, now: datetime
    ) -> list[AuthorizationRequest]:
        """``requests`` with their budgets' standings (one query for what is not cached)."""
        charges = charges_of(requests, policies, now)
        if not charges:
            return list(requests)
        usage = await self._usage({c.window for c in charges})
        standings: dict[int, list[BudgetStanding]] = {}
        for charge in charges:
            used, reserved = usage.get(charge.window, (0, 0))
            standings.setdefault(charge.index, []).append(
                BudgetStanding(name=charge.name, used=used, reserved=reserved, cap=charge.cap)
            )
        return [
            replace(r, budgets=tuple(standings[i])) if i in standings else r
            for i, r in enumerate(requests)
        ]

    async def _usage(self, windows: set[WindowAsk]) -> dict[WindowAsk, WindowUsage]:
        now = self._clock()
        fresh = {w: self._cache[w] for w in windows if w in self._cache}
        fresh = {w: read for w, read in fresh.items() if now - read[0] < self._ttl}
        missing = sorted(windows - set(fresh))
        found = {w: usage for w, (_, usage) in fresh.items()}
        if missing:
            answered = await self._query(missing)
            for window in missing:
                found[window] = answered.get(window, (0, 0))
                self._cache[window] = (now, found[window])
            # Drop what expired (old windows, scopes not asked lately): the cache stays small.
            self._cache = {w: r for w, r in self._cache.items() if now - r[0] < self._ttl}
        return found
