"""`ratifier budgets`: the budgets of the policy set in force for one tenant (its own where
one replaces the default), with each window's usage and when it resets (docs/budgets.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from commands.budgets import Budget, budgets_for_tenant, window_of
from commands.policy import PolicySet
from config.settings import Settings
from executors.budgets import BudgetBook, WindowUsage
from feeds.policies import PolicyFeed, local_policies
from runtime.clients import database_conninfo, pg_pool


async def policies_in_force(settings: Settings, *, local: bool) -> PolicySet:
    """The set the workers enforce (newest valid one on the `policies` topic), or the local
    folder's with ``local``."""
    policies = local_policies(settings)
    if local:
        return policies
    feed = PolicyFeed(settings, policies)
    await feed.catch_up(announce=False)
    return feed.current


async def budget_usage(
    settings: Settings, budgets: Sequence[Budget], *, tenant: str, now: datetime
) -> list[WindowUsage]:
    book = BudgetBook()
    pool: Any = pg_pool(database_conninfo(settings), max_size=1, dict_rows=True)
    async with pool, pool.connection() as conn:
        found: list[WindowUsage] = []
        for budget in budgets:
            found += await book.usage(conn, budget, tenant=tenant, now=now)
        return found


def _local(budget: Budget, at: datetime | None) -> str:
    """A reset time in the budget's own time zone (where its days and weeks are counted)."""
    if at is None:
        return "-"
    return at.astimezone(ZoneInfo(budget.time_zone)).isoformat(timespec="seconds")


def _amount(budget: Budget, value: int) -> str:
    return f"{value} calls" if budget.argument is None else f"{value} {budget.argument}"


def origin(budget: Budget, budgets: Sequence[Budget]) -> str:
    """Where a budget in force for a tenant comes from, when it is the tenant's own: " (tenant
    T's own, replaces the default cap C)" or " (tenant T's own, no default)"; "" for the
    default."""
    if budget.tenant is None:
        return ""
    default = next((b for b in budgets if b.name == budget.name and b.tenant is None), None)
    replaced = f"replaces the default cap {default.cap}" if default else "no default"
    return f" (tenant {budget.tenant}'s own, {replaced})"


def describe_budgets(
    budgets: Sequence[Budget], usages: Sequence[WindowUsage], *, tenant: str, now: datetime
) -> list[str]:
    """Each budget in force for ``tenant`` (of the set's ``budgets``: its own replacing the
    default) with its declaration, then each scope's current window: used (consumed plus
    reserved for calls still unknown), cap, what is left and when it resets."""
    if not budgets:
        return ["the policy set in force declares no budgets"]
    in_force = budgets_for_tenant(budgets, tenant)
    if not in_force:
        return [f"no budget of the policy set in force applies to tenant {tenant}"]
    lines = []
    for budget in in_force:
        window = (
            f"rolling {budget.rolling_hours} h"
            if budget.window == "rolling"
            else f"{budget.window} in {budget.time_zone}"
        )
        lines.append(
            f"{budget.name}{origin(budget, budgets)}: "
            f"{budget.measure} <= {budget.cap} per {window}, "
            f"tools {', '.join(budget.tools) or 'all writes'}, "
            f"per tenant{''.join(f', {p}' for p in budget.per if p != 'tenant')}"
        )
        mine = [u for u in usages if u.budget.name == budget.name]
        span = window_of(budget, now)
        if not mine:
            resets = _local(budget, span.resets_at)
            lines.append(f"    tenant {tenant}: nothing used in {span.key} (resets {resets})")
        for usage in mine:
            resets = _local(budget, usage.resets_at)
            lines.append(
                f"    tenant {usage.tenant} {usage.scope_key}: used "
                f"{_amount(budget, usage.used)} of {budget.cap} "
                f"({usage.reserved} reserved for calls not yet settled), "
                f"left {max(budget.cap - usage.used, 0)}, window {usage.window_key}, "
                f"resets {resets}"
            )
    return lines


async def report(settings: Settings, *, tenant: str, local: bool) -> list[str]:
    policies = await policies_in_force(settings, local=local)
    now = datetime.now(UTC)
    in_force = policies.budgets_for(tenant)
    usages = await budget_usage(settings, in_force, tenant=tenant, now=now)
    return [
        f"policy set {policies.version}",
        *describe_budgets(policies.budgets, usages, tenant=tenant, now=now),
    ]
