"""Budgets as Cedar context (docs/budgets.md, "Budgets in Cedar policies"): the generated
schema declares `context.budgets`, the authorizer fills it from a batched, briefly cached
view, and a policy routes a call to a human above 80 % of the day's budget."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from commands.budgets import BudgetStanding, load_budget_file
from commands.catalog import Catalog
from commands.cedar_schema import generate_schema
from commands.policy import (
    DEFAULT_POLICY_DIR,
    AuthorizationRequest,
    PolicySet,
    authorize_batch,
    check_policy_directory,
)
from commands.reference import catalog as reference_catalog
from schemas.envelopes import Actor, AuthorizedCall, Route
from schemas.errors import ConfigurationError
from streams.authorizer import on_validated_batch, one_by_one
from streams.budget_view import BudgetView, WindowAsk
from tests.unit.conftest import KEYS, NOW
from tests.unit.test_budgets import REFUNDS_DAILY, budget
from tests.unit.test_stages import PAYMENT, FakeStore, validated

# Routes an otherwise auto-approved refund to a human once 80 % of the agent's day is used.
NEAR_BUDGET = """
@id("refunds-near-budget-need-approval")
@approval("required")
permit (principal, action == Action::"propose_refund", resource)
when {
  resource.tenant == principal.tenant &&
  principal.roles.contains("refund") &&
  context.arguments.amount_minor <= resource.refundable_minor &&
  context.budgets["refunds-daily"].percent_used >= 80
};
"""


def budgeted_directory(
    tmp_path: Path, policy: str = NEAR_BUDGET, *, budgets: str = REFUNDS_DAILY
) -> Path:
    directory = tmp_path / "policies"
    shutil.copytree(DEFAULT_POLICY_DIR, directory)
    (directory / "budgets.toml").write_text(budgets, encoding="utf-8")
    schema = generate_schema(reference_catalog, load_budget_file(directory))
    (directory / "schema.cedarschema.json").write_text(schema.text(), encoding="utf-8")
    (directory / "budgets.cedar").write_text(policy, encoding="utf-8")
    return directory


class FakeWindows:
    """The view's query, answering from a dict and counting how often it is asked."""

    def __init__(self, used: int) -> None:
        self.used = used
        self.asked: list[list[WindowAsk]] = []

    async def __call__(self, windows: Sequence[WindowAsk]) -> dict[WindowAsk, tuple[int, int]]:
        self.asked.append(list(windows))
        return {w: (self.used, 700) for w in windows}


def refund(call_id: str = "c-1", amount: int = 100) -> Any:
    return validated(
        call_id=call_id,
        idempotency_key=f"k-{call_id}",
        roles=("refund", "refund_auto"),
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": amount, "reason": "r"},
    )


def test_the_generated_schema_declares_the_budgets_of_each_action(tmp_path: Path) -> None:
    budgets = load_budget_file(budgeted_directory(tmp_path))
    actions = generate_schema(reference_catalog, budgets).schema[""]["actions"]
    context = actions["propose_refund"]["appliesTo"]["context"]["attributes"]
    standing = context["budgets"]["attributes"]["refunds-daily"]["attributes"]
    assert {n: t["type"] for n, t in standing.items()} == {
        "name": "String",
        "used": "Long",
        "reserved": "Long",
        "cap": "Long",
        "percent_used": "Long",
    }
    # Not a budget of the tool: no `context.budgets` (and no budgets: the schema as before).
    assert "budgets" not in actions["get_payment"]["appliesTo"]["context"]["attributes"]
    assert (
        generate_schema(reference_catalog).schema == generate_schema(reference_catalog, ()).schema
    )
    assert "budgets" not in str(generate_schema(reference_catalog).schema)


def test_policy_check_validates_policies_using_budgets(tmp_path: Path) -> None:
    assert check_policy_directory(budgeted_directory(tmp_path / "ok"), reference_catalog) == []
    typo = NEAR_BUDGET.replace('["refunds-daily"]', '["refund-daily"]')
    problems = check_policy_directory(
        budgeted_directory(tmp_path / "typo", typo), reference_catalog
    )
    assert len(problems) == 1 and "refund-daily" in str(problems[0])


def test_a_schema_naming_a_budget_the_set_lacks_is_refused(tmp_path: Path) -> None:
    directory = budgeted_directory(tmp_path)
    (directory / "budgets.toml").write_text("budgets = []\n", encoding="utf-8")
    (directory / "budgets.cedar").unlink()
    with pytest.raises(ConfigurationError, match="refunds-daily"):
        PolicySet.from_directory(directory)


def test_percent_used_is_a_whole_percent_rounded_down() -> None:
    assert BudgetStanding(name="b", used=39_999, reserved=0, cap=50_000).percent_used == 79
    assert BudgetStanding(name="b", used=40_000, reserved=0, cap=50_000).percent_used == 80
    assert BudgetStanding(name="b", used=0, reserved=0, cap=0).percent_used == 100


def test_without_a_view_the_budgets_count_as_unused(tmp_path: Path) -> None:
    """The executor's commit-time re-check has no view: its policy sees the budgets unused
    (its own budget check decides there), and Cedar still gets the declared attribute."""
    policies = PolicySet.from_directory(budgeted_directory(tmp_path))
    request = AuthorizationRequest(
        actor=Actor(sub="agent-1", tenant="tenant-a", roles=("refund", "refund_auto")),
        tool=reference_catalog.get("propose_refund"),  # type: ignore[arg-type]
        resource=PAYMENT,
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
    )
    (decision,) = authorize_batch([request], policies)
    assert decision.permitted and decision.errors == ()
    assert decision.route is Route.AUTO


async def test_a_refund_above_80_percent_of_the_day_needs_approval(
    catalog: Catalog, tmp_path: Path
) -> None:
    policies = PolicySet.from_directory(budgeted_directory(tmp_path))
    fetch = one_by_one(FakeStore(PAYMENT).fetch)
    args: dict[str, Any] = {"catalog": catalog, "keys": KEYS, "policies": policies, "now": NOW}

    async def route_at(used: int) -> Route:
        view = BudgetView(FakeWindows(used))
        (emits,) = await on_validated_batch(
            [refund()], fetch_many=fetch, budgets=view.with_budgets, **args
        )
        assert isinstance(emits[0].value, AuthorizedCall)
        return emits[0].value.route

    assert await route_at(39_999) is Route.AUTO  # 79 %: the small-refund policy auto-commits
    assert await route_at(40_000) is Route.APPROVAL  # 80 %: a human decides
    # Without the view (as before this change), the same call is auto-approved.
    (emits,) = await on_validated_batch([refund()], fetch_many=fetch, **args)
    assert isinstance(emits[0].value, AuthorizedCall) and emits[0].value.route is Route.AUTO


async def test_the_view_reads_a_batch_once_and_caches_it_briefly(
    catalog: Catalog, tmp_path: Path
) -> None:
    policies = PolicySet.from_directory(budgeted_directory(tmp_path))
    windows = FakeWindows(45_000)
    clock = [100.0]
    view = BudgetView(windows, ttl_seconds=1.0, clock=lambda: clock[0])
    requests = [
        AuthorizationRequest(
            actor=Actor(sub=sub, tenant="tenant-a", roles=("refund",)),
            tool=catalog.get("propose_refund"),  # type: ignore[arg-type]
            resource=PAYMENT,
            arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
        )
        for sub in ("bot-1", "bot-2", "bot-1")
    ]
    decided = await view.with_budgets(requests, policies, NOW)
    # One query for the batch, one window per distinct scope (per agent here).
    (asked,) = windows.asked
    assert sorted(w.scope_key for w in asked) == ["agent=bot-1", "agent=bot-2"]
    assert {w.tenant for w in asked} == {"tenant-a"}
    assert {w.window_key for w in asked} == {"day:2026-11-29@Europe/Berlin"}
    assert decided[0].budgets == (
        BudgetStanding(name="refunds-daily", used=45_000, reserved=700, cap=50_000),
    )
    await view.with_budgets(requests, policies, NOW)
    assert len(windows.asked) == 1  # within the TTL: from the cache
    clock[0] += 1.0
    await view.with_budgets(requests, policies, NOW)
    assert len(windows.asked) == 2  # stale: read again
    # A read tool has no budgets: nothing asked.
    read = AuthorizationRequest(
        actor=Actor(sub="bot-1", tenant="tenant-a"),
        tool=catalog.get("get_payment"),  # type: ignore[arg-type]
        resource=PAYMENT,
        arguments={"payment_id": "pay_A1001"},
    )
    assert await view.with_budgets([read], policies, NOW) == [read]
    assert len(windows.asked) == 2


def test_the_dashboard_shapes_each_budget_with_its_scopes_bar_and_reset() -> None:
    from datetime import UTC, datetime

    from commands.budgets import Budget
    from dashboard.shaping import budgets_panel

    daily = budget()
    calls = Budget.model_validate(
        {"name": "calls", "measure": "count", "cap": 10, "window": "rolling", "rolling_hours": 2}
    )
    now = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    rows = [
        {
            "budget": "refunds-daily",
            "scope_key": "agent=a",
            "consumed": 10_000,
            "reserved": 0,
            "oldest": now,
        },
        {
            "budget": "refunds-daily",
            "scope_key": "agent=b",
            "consumed": 52_000,
            "reserved": 700,
            "oldest": now,
        },
        {"budget": "calls", "scope_key": "*", "consumed": 3, "reserved": 1, "oldest": now},
    ]
    daily_shown, calls_shown = budgets_panel([daily, calls], rows, now=now)
    assert daily_shown["window"] == "day in Europe/Berlin"
    assert daily_shown["per"] == ["tenant", "agent"] and daily_shown["unit"] == "amount_minor"
    over, under = daily_shown["scopes"]  # most used first
    assert (over["scope"], over["used"], over["reserved"], over["left"]) == (
        "agent=b",
        52_700,
        700,
        0,
    )
    assert over["percent_used"] == 100  # the bar is full, never past it
    assert (under["used"], under["left"], under["percent_used"]) == (10_000, 40_000, 20)
    assert under["resets_at"] == "2026-12-03T00:00:00+01:00"  # local midnight
    assert calls_shown["unit"] == "calls" and calls_shown["window"] == "rolling 2 h"
    (scope,) = calls_shown["scopes"]
    # A rolling window frees something when its oldest reservation leaves it.
    assert scope["resets_at"] == "2026-12-02T12:00:00+00:00"
    (empty,) = budgets_panel([daily], [], now=now)
    assert empty["scopes"] == [] and empty["resets_at"] == "2026-12-03T00:00:00+01:00"
