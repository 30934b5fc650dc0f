"""The authorizer's budget view on real PostgreSQL (docs/budgets.md, "Budgets in Cedar
policies"): one query per batch over `budget_usage`, tenant in its WHERE, and a policy that
sends a refund to a human above 80 % of the agent's day while one below runs automatically."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from commands.budgets import load_budget_file, window_of
from commands.policy import PolicySet
from commands.reference import catalog
from config.settings import Settings
from runtime.clients import pg_pool
from schemas.envelopes import AuthorizedCall, Route
from streams.authorizer import on_validated_batch
from streams.budget_view import BudgetView
from streams.storage import StreamStorage
from tests.unit.conftest import KEYS
from tests.unit.test_budget_context import NEAR_BUDGET, budgeted_directory
from tests.unit.test_budgets import REFUNDS_DAILY
from tests.unit.test_stages import validated

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
async def pool(settings: Settings) -> Any:
    async with pg_pool(settings.storage.database_url, max_size=2, dict_rows=True) as pool:
        yield pool


async def add_usage(
    pool: AsyncConnectionPool[Any],
    *,
    tenant: str,
    budget: str,
    scope: str,
    window: str,
    amount: int,
    state: str = "consumed",
    at: datetime | None = None,
) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, "
            "amount, state, reserved_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                tenant,
                budget,
                uuid.uuid4().hex,
                scope,
                window,
                amount,
                state,
                at or datetime.now(UTC),
            ),
        )


def refund(agent: str, call_id: str) -> Any:
    from tests.unit.conftest import token

    return validated(
        call_id=call_id,
        idempotency_key=f"k-{call_id}",
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
        context=token(sub=agent, roles=("refund", "refund_auto")),
    )


async def test_a_refund_below_80_percent_runs_automatically_one_above_needs_approval(
    settings: Settings, pool: AsyncConnectionPool[Any], tmp_path: Path
) -> None:
    # The test database outlives sessions: a budget of this test only.
    name = f"refunds-{uuid.uuid4().hex[:10]}"
    directory = budgeted_directory(
        tmp_path,
        NEAR_BUDGET.replace("refunds-daily", name),
        budgets=REFUNDS_DAILY.replace("refunds-daily", name),
    )
    policies = PolicySet.from_directory(directory)
    (budget,) = load_budget_file(directory)
    now = datetime.now(UTC)
    window = window_of(budget, now).key
    # bot-low: 79 % used; bot-high: 80 % (part of it still reserved).
    await add_usage(
        pool, tenant="tenant-a", budget=name, scope="agent=bot-low", window=window, amount=39_500
    )
    await add_usage(
        pool, tenant="tenant-a", budget=name, scope="agent=bot-high", window=window, amount=30_000
    )
    await add_usage(
        pool,
        tenant="tenant-a",
        budget=name,
        scope="agent=bot-high",
        window=window,
        amount=10_000,
        state="reserved",
    )
    # What does not count: released, yesterday's window, another tenant's usage.
    await add_usage(
        pool,
        tenant="tenant-a",
        budget=name,
        scope="agent=bot-low",
        window=window,
        amount=9_000,
        state="released",
    )
    yesterday = window_of(budget, now - timedelta(days=1))
    await add_usage(
        pool,
        tenant="tenant-a",
        budget=name,
        scope="agent=bot-low",
        window=yesterday.key,
        amount=9_000,
        at=yesterday.since,
    )
    await add_usage(
        pool, tenant="tenant-b", budget=name, scope="agent=bot-low", window=window, amount=9_000
    )

    storage = StreamStorage(settings.storage.database_url)
    asked: list[int] = []

    async def windows(asks: Any) -> Any:
        asked.append(len(asks))
        return await storage.budget_windows(asks)

    view = BudgetView(windows)
    try:
        routed = await on_validated_batch(
            [refund("bot-low", f"low-{name}"), refund("bot-high", f"high-{name}")],
            catalog=catalog,
            keys=KEYS,
            policies=policies,
            fetch_many=storage.fetch_many,
            now=now,
            budgets=view.with_budgets,
        )
    finally:
        await storage.close()
    assert asked == [2]  # one query for the batch's two windows
    low, high = (emits[0].value for emits in routed)
    assert isinstance(low, AuthorizedCall) and isinstance(high, AuthorizedCall)
    # 79 %: auto-approved by the small-refund policy; 80 %: a human decides.
    assert low.route is Route.AUTO
    assert low.auto_approved_by == "refund-small-auto-for-trusted-agents"
    assert high.route is Route.APPROVAL and high.auto_approved_by is None
    assert "refunds-near-budget-need-approval" in high.policies
