"""Spending budgets on real PostgreSQL (docs/budgets.md): the window locked, summed and
reserved in the executor's commit transaction, so concurrent commits never pass a cap, a
redelivery never counts twice, and a reservation follows its operation's outcome (an
`unknown` one holds it until reconciliation settles it)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from commands.budgets import Budget, load_budget_file, window_of
from commands.policy import PolicySet
from commands.reference import catalog
from config.settings import Settings
from dashboard.server import create_app
from executors.budgets import BudgetBook
from executors.claims import Claim, ClaimKind, ClaimStore
from executors.executor import CommandExecutor, GroupMember
from executors.reconciler import Reconciler
from runtime.clients import pg_pool
from schemas.envelopes import CommittedCommand, Status
from schemas.errors import ErrorCode
from tests.integration.test_executor import (
    POLICIES,
    command,
    provider_faults,
    provider_stats,
    scalar,
)
from tests.services import bearer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TENANT = "tenant-a"


def daily(name: str, cap: int, **overrides: Any) -> Budget:
    return Budget.model_validate(
        {
            "name": name,
            "tools": ["propose_refund"],
            "per": ["agent"],
            "measure": "sum:amount_minor",
            "cap": cap,
            "window": "day",
            "time_zone": "Europe/Berlin",
            **overrides,
        }
    )


def unique(prefix: str) -> str:
    # The test database outlives sessions: every test uses budgets of its own.
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def usage(pool: AsyncConnectionPool[Any], budget: str) -> dict[str, tuple[str, int]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT operation_id, state, amount FROM budget_usage "
            "WHERE tenant = %s AND budget = %s",
            (TENANT, budget),
        )
        return {r["operation_id"]: (r["state"], r["amount"]) for r in await cur.fetchall()}


@pytest.fixture
async def payment(pool: AsyncConnectionPool[Any]) -> str:
    """A payment of this test with enough refundable balance that only budgets limit it."""
    payment_id = f"pay_BUD{uuid.uuid4().hex[:12]}"
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, currency, "
            "refundable_minor, status) VALUES (%s, %s, 'budget@example.com', 10000000, 'EUR', "
            "10000000, 'captured')",
            (TENANT, payment_id),
        )
    return payment_id


def refund(payment_id: str, amount: int, key: str | None = None) -> CommittedCommand:
    return command(
        "propose_refund",
        {"payment_id": payment_id, "amount_minor": amount, "reason": "budget test"},
        key=key,
        roles=("refund",),
        approved=True,
    )


@pytest.fixture
async def started(settings: Settings, provider_url: str) -> AsyncIterator[None]:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    yield
    await catalog.stop()


# An executor on the reference catalog (started) whose policy set has the budgets given.
ExecutorFor = Callable[..., CommandExecutor]


@pytest.fixture
def executor_for(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, started: None
) -> ExecutorFor:
    def build(*budgets: Budget) -> CommandExecutor:
        policies = PolicySet.from_sources(POLICIES.text, POLICIES.schema, tuple(budgets))
        return CommandExecutor(
            pool=pool,
            claims=ClaimStore(redis, prefix=settings.topic_prefix, owner=unique("budget-executor")),
            catalog=catalog,
            policies=policies,
            retry_attempts=2,
        )

    return build


async def test_concurrent_reservations_never_pass_the_cap(settings: Settings) -> None:
    """200 reservations of random amounts from 8 connections at once against one window."""
    budget = daily(unique("concurrent"), 50_000)
    book = BudgetBook()
    amounts = [random.randint(100, 999) for _ in range(200)]
    wide = pg_pool(settings.storage.database_url, max_size=8, dict_rows=True)
    await wide.open(wait=True, timeout=10)

    async def reserve(i: int, amount: int) -> bool:
        async with wide.connection() as conn, conn.transaction():
            refused = await book.reserve(
                conn,
                [budget],
                tenant=TENANT,
                operation_id=f"{TENANT}:{budget.name}-{i}",
                agent="agent-1",
                subject=None,
                tool="propose_refund",
                arguments={"amount_minor": amount},
            )
            return refused is None

    try:
        fitted = await asyncio.gather(*(reserve(i, a) for i, a in enumerate(amounts)))
        rows = await usage(wide, budget.name)
    finally:
        await wide.close()
    reserved = sum(a for a, ok in zip(amounts, fitted, strict=True) if ok)
    refused = [a for a, ok in zip(amounts, fitted, strict=True) if not ok]
    assert reserved == sum(amount for _, amount in rows.values())
    assert len(rows) == fitted.count(True)
    assert reserved <= budget.cap
    assert refused, "the amounts add up to about twice the cap: some must be refused"
    # Each refusal saw at least what is left now, and did not fit in it.
    assert budget.cap - reserved < min(refused)


async def test_a_redelivered_operation_is_not_counted_twice(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    payment: str,
) -> None:
    budget = daily(unique("redelivery"), 1_000)
    book = BudgetBook()
    for _ in range(2):  # the same operation reserving again changes nothing
        async with pool.connection() as conn, conn.transaction():
            assert (
                await book.reserve(
                    conn,
                    [budget],
                    tenant=TENANT,
                    operation_id=f"{TENANT}:once",
                    agent="agent-1",
                    subject=None,
                    tool="propose_refund",
                    arguments={"amount_minor": 600},
                )
                is None
            )
    assert list((await usage(pool, budget.name)).values()) == [("reserved", 600)]
    # Through the executor: a redelivered command is answered from the ledger.
    other = daily(unique("redelivery-exec"), 1_000)
    executor = executor_for(other)
    first = refund(payment, 700)
    assert (await executor.execute(first, trace_id=None)).outcome.status is Status.SUCCEEDED
    again = first.model_copy(update={"call_id": f"{first.call_id}-again"})
    assert (await executor.execute(again, trace_id=None)).outcome.status is Status.SUCCEEDED
    assert await usage(pool, other.name) == {first.operation_id: ("consumed", 700)}


async def test_over_budget_is_denied_with_what_is_left_and_audited(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    payment: str,
    provider_url: str,
) -> None:
    budget = daily(unique("over"), 1_000)
    executor = executor_for(budget)
    fits = refund(payment, 900)
    assert (await executor.execute(fits, trace_id=None)).outcome.status is Status.SUCCEEDED
    over = refund(payment, 101)
    outcome = (await executor.execute(over, trace_id=None)).outcome
    assert outcome.status is Status.DENIED
    assert outcome.error is not None and outcome.error.code is ErrorCode.BUDGET_EXCEEDED
    assert "100 of 1000 remain" in outcome.error.message
    assert "resets at" in outcome.error.message
    assert over.operation_id not in (await provider_stats(provider_url))["by_key"]
    assert await usage(pool, budget.name) == {fits.operation_id: ("consumed", 900)}
    assert (
        await scalar(
            pool,
            "SELECT detail->>'code' FROM audit_log WHERE tenant = %s AND call_id = %s",
            TENANT,
            over.call_id,
        )
        == "budget_exceeded"
    )
    # Exactly what is left still fits.
    last = refund(payment, 100)
    assert (await executor.execute(last, trace_id=None)).outcome.status is Status.SUCCEEDED
    # `ratifier budgets` reads the same window: all of it used, none of it still reserved.
    async with pool.connection() as conn:
        (window,) = await BudgetBook().usage(conn, budget, tenant=TENANT, now=datetime.now(UTC))
        assert (
            await BudgetBook().usage(conn, budget, tenant="tenant-b", now=datetime.now(UTC)) == []
        )
    assert (window.scope_key, window.consumed, window.reserved) == ("agent=agent-1", 1_000, 0)
    assert window.resets_at is not None and window.resets_at > datetime.now(UTC)


async def test_a_failed_effect_releases_its_reservation(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    payment: str,
    provider_url: str,
) -> None:
    budget = daily(unique("release"), 1_000)
    executor = executor_for(budget)
    await provider_faults(provider_url, fail_before=10)  # every retry answers 503
    try:
        spent = refund(payment, 800)
        outcome = (await executor.execute(spent, trace_id=None)).outcome
    finally:
        await provider_faults(provider_url, fail_before=0)
    assert outcome.error is not None and outcome.error.code is ErrorCode.RETRY_EXHAUSTED
    assert await usage(pool, budget.name) == {spent.operation_id: ("released", 800)}
    after = refund(payment, 1_000)  # the released amount counts no more
    assert (await executor.execute(after, trace_id=None)).outcome.status is Status.SUCCEEDED


async def settle(pool: AsyncConnectionPool[Any], operation_id: str) -> Status:
    reconciler = Reconciler(pool=pool, catalog=catalog, attempts=3, backoff_base=0.05)
    for _ in range(100):
        # Earlier sessions' unknown operations may be due too; ours is the one that counts.
        for outcome in await reconciler.run_due():
            if outcome.operation_id == operation_id:
                return outcome.status
        await asyncio.sleep(0.05)
    raise AssertionError(f"{operation_id} was not settled")


async def test_unknown_holds_its_reservation_until_settled_as_applied(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    payment: str,
    provider_url: str,
) -> None:
    budget = daily(unique("unknown-applied"), 1_000)
    executor = executor_for(budget)
    await provider_faults(provider_url, drop_after=1)  # applied, the answer lost
    lost = refund(payment, 700)
    first = await executor.execute(lost, trace_id=None)
    assert first.unknown
    assert await usage(pool, budget.name) == {lost.operation_id: ("reserved", 700)}
    # While it is unknown, its amount still counts: 400 more would pass the cap.
    held = refund(payment, 400)
    outcome = (await executor.execute(held, trace_id=None)).outcome
    assert outcome.error is not None and outcome.error.code is ErrorCode.BUDGET_EXCEEDED
    assert await settle(pool, lost.operation_id) is Status.SUCCEEDED
    assert await usage(pool, budget.name) == {lost.operation_id: ("consumed", 700)}


async def test_unknown_holds_its_reservation_until_settled_as_failed(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    settings: Settings,
    payment: str,
    provider_url: str,
) -> None:
    budget = daily(unique("unknown-failed"), 1_000)
    executor = executor_for(budget)
    await provider_faults(provider_url, down=True)  # the connection closed: unknown
    try:
        lost = refund(payment, 700)
        first = await executor.execute(lost, trace_id=None)
    finally:
        await provider_faults(provider_url, down=False)
    assert first.unknown
    assert lost.operation_id not in (await provider_stats(provider_url))["by_key"]
    assert await usage(pool, budget.name) == {lost.operation_id: ("reserved", 700)}
    # Reconciliation meets a provider that refuses the lookup (a 4xx that is not its "not
    # found"): failed downstream, definitely; the reservation is released.
    await catalog.stop()
    await catalog.start(settings.model_copy(update={"provider_url": f"{provider_url}/gone"}))
    assert await settle(pool, lost.operation_id) is Status.FAILED
    assert await usage(pool, budget.name) == {lost.operation_id: ("released", 700)}


async def test_a_group_commit_reserves_each_member_in_its_savepoint(
    pool: AsyncConnectionPool[Any],
    executor_for: ExecutorFor,
    payment: str,
) -> None:
    budget = daily(unique("group"), 1_000)
    executor = executor_for(budget)
    group = [refund(payment, amount) for amount in (400, 500, 300, 100)]
    results = await executor.execute_group(
        [
            GroupMember(command=c, trace_id=None, claim=Claim(kind=ClaimKind.UNAVAILABLE))
            for c in group
        ]
    )
    statuses = [r.outcome.status if r is not None else None for r in results]
    assert statuses == [Status.SUCCEEDED, Status.SUCCEEDED, Status.DENIED, Status.SUCCEEDED]
    rows = await usage(pool, budget.name)
    assert sorted(rows.values()) == [("consumed", 100), ("consumed", 400), ("consumed", 500)]


# -- per-tenant caps (issue 42, docs/budgets.md "Setting tenants apart") ----------------------


async def tenant_payment(pool: AsyncConnectionPool[Any], tenant: str) -> str:
    payment_id = f"pay_BUD{uuid.uuid4().hex[:12]}"
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, currency, "
            "refundable_minor, status) VALUES (%s, %s, 'budget@example.com', 10000000, 'EUR', "
            "10000000, 'captured')",
            (tenant, payment_id),
        )
    return payment_id


def tenant_refund(tenant: str, payment_id: str, amount: int) -> CommittedCommand:
    return command(
        "propose_refund",
        {"payment_id": payment_id, "amount_minor": amount, "reason": "budget test"},
        tenant=tenant,
        roles=("refund",),
        approved=True,
    )


async def tenant_usage(
    pool: AsyncConnectionPool[Any], budget: str
) -> dict[str, list[tuple[str, int]]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant, state, amount FROM budget_usage WHERE budget = %s "
            "ORDER BY tenant, reserved_at",
            (budget,),
        )
        found: dict[str, list[tuple[str, int]]] = {}
        for r in await cur.fetchall():
            found.setdefault(r["tenant"], []).append((r["state"], r["amount"]))
        return found


async def test_a_tenant_is_capped_at_its_own_amount_while_others_get_the_default(
    pool: AsyncConnectionPool[Any], executor_for: ExecutorFor
) -> None:
    """500.00 a day for every tenant, 200.00 for tenant-a (its own budget of the same name),
    and a count of tenant-a's refunds that no other tenant has: through the executor's commit
    transaction on real PostgreSQL, each tenant in windows of its own."""
    name, count_name = unique("tenants"), unique("tenant-a-only")
    default = daily(name, 50_000)
    own = daily(name, 20_000, tenant="tenant-a")
    only_a = daily(count_name, 10, tenant="tenant-a", measure="count")
    executor = executor_for(default, own, only_a)
    a_payment, b_payment = (
        await tenant_payment(pool, "tenant-a"),
        await tenant_payment(pool, "tenant-b"),
    )

    async def run(tenant: str, payment_id: str, amount: int) -> Any:
        return (
            await executor.execute(tenant_refund(tenant, payment_id, amount), trace_id=None)
        ).outcome

    # tenant-a: its own 200.00, not the default 500.00.
    assert (await run("tenant-a", a_payment, 20_000)).status is Status.SUCCEEDED
    over_a = await run("tenant-a", a_payment, 1)
    assert over_a.status is Status.DENIED
    assert over_a.error is not None and over_a.error.code is ErrorCode.BUDGET_EXCEEDED
    assert f"Budget {name} exceeded" in over_a.error.message
    assert "0 of 20000 remain" in over_a.error.message
    # tenant-b: the default 500.00, in windows of its own (tenant-a's use takes nothing).
    assert (await run("tenant-b", b_payment, 30_000)).status is Status.SUCCEEDED
    assert (await run("tenant-b", b_payment, 20_000)).status is Status.SUCCEEDED
    over_b = await run("tenant-b", b_payment, 1)
    assert over_b.error is not None and over_b.error.code is ErrorCode.BUDGET_EXCEEDED
    assert "0 of 50000 remain" in over_b.error.message
    assert await tenant_usage(pool, name) == {
        "tenant-a": [("consumed", 20_000)],  # a refusal reserves nothing in its budget
        "tenant-b": [("consumed", 30_000), ("consumed", 20_000)],
    }
    # The budget only tenant-a has counts its calls alone (the refused one's reservation,
    # made first in the lock order, is released by its refusal).
    assert await tenant_usage(pool, count_name) == {"tenant-a": [("consumed", 1), ("released", 1)]}
    # `ratifier budgets --tenant` and the dashboard read each tenant's window.
    now = datetime.now(UTC)
    async with pool.connection() as conn:
        (a_window,) = await BudgetBook().usage(conn, own, tenant="tenant-a", now=now)
        (b_window,) = await BudgetBook().usage(conn, default, tenant="tenant-b", now=now)
    assert (a_window.used, a_window.budget.cap) == (20_000, 20_000)
    assert (b_window.used, b_window.budget.cap) == (50_000, 50_000)


async def test_the_dashboard_shows_each_tenant_the_budgets_in_force_for_it(
    own_settings: Settings, tmp_path: Path
) -> None:
    """GET /api/budgets as tenant-a shows its own cap (marked as its own) and its usage; as
    tenant-b the default; neither sees the other's budget or usage."""
    from tests.unit.test_budget_context import budgeted_directory
    from tests.unit.test_budget_tenants import TENANTS

    name = unique("tenants-api")
    directory = budgeted_directory(tmp_path, "", budgets=TENANTS.replace("daily-refunds", name))
    (directory / "budgets.cedar").unlink()
    settings = own_settings.model_copy(
        update={"policies": own_settings.policies.model_copy(update={"directory": str(directory)})}
    )
    own = next(b for b in load_budget_file(directory) if b.tenant == "tenant-a")
    now = datetime.now(UTC)
    tenant_a, tenant_b = unique("ta"), unique("tb")
    # The test database outlives sessions: tenants of this test's own, named in the file.
    text = (directory / "budgets.toml").read_text(encoding="utf-8")
    (directory / "budgets.toml").write_text(
        text.replace('"tenant-a"', f'"{tenant_a}"'), encoding="utf-8"
    )
    with psycopg.connect(settings.storage.database_url, autocommit=True) as conn:
        for owner, amount in ((tenant_a, 15_000), (tenant_b, 1_000)):
            conn.execute(
                "INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, "
                "amount, state, reserved_at) VALUES (%s, %s, %s, '*', %s, %s, 'consumed', %s)",
                (owner, name, uuid.uuid4().hex, window_of(own, now).key, amount, now),
            )

    async with TestClient(TestServer(create_app(settings))) as dashboard:

        async def shown(tenant: str) -> list[tuple[str, int, bool, list[int]]]:
            answer = await dashboard.get(
                "/api/budgets", headers=bearer(settings, tenant, ("support",))
            )
            assert answer.status == 200
            return [
                (b["name"], b["cap"], b["tenant_specific"], [s["used"] for s in b["scopes"]])
                for b in (await answer.json())["budgets"]
            ]

        assert await shown(tenant_a) == [(name, 20_000, True, [15_000])]
        assert await shown(tenant_b) == [(name, 50_000, False, [1_000])]
