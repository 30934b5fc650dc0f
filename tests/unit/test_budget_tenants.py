"""Per-tenant budgets (issue 42): ``tenant =`` on a budget makes it that tenant's own and
replaces the default of the same name for it (as in limits.toml); errors name the bad budget
first, by its name, file and line; `ratifier budgets`, the dashboard and ``context.budgets``
show the budgets in force for the tenant (docs/budgets.md, "Setting tenants apart")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from commands.budgets import (
    UNCAPPED,
    Budget,
    budgets_for_tenant,
    canonical_budgets,
    check_budgets,
    load_budget_file,
    parse_budgets,
)
from commands.cedar_schema import generate_schema
from commands.policy import (
    AuthorizationRequest,
    PolicySet,
    budgets_record,
    check_policy_directory,
    directory_budgets,
)
from commands.reference import catalog
from config.settings import Settings
from dashboard.shaping import budgets_panel
from feeds.policies import PolicyFeed, policy_record
from schemas.envelopes import Actor
from schemas.errors import ConfigurationError
from tests.unit.test_budget_context import NEAR_BUDGET, budgeted_directory
from tests.unit.test_budgets import budget, with_budgets

# 500.00 a day for every tenant, 200.00 for tenant-a, and a count only tenant-c has.
TENANTS = """
[[budgets]]
name = "daily-refunds"
tools = ["propose_refund"]
measure = "sum:amount_minor"
cap = 50000
window = "day"

[[budgets]]
name = "daily-refunds"
tenant = "tenant-a"
tools = ["propose_refund"]
measure = "sum:amount_minor"
cap = 20000
window = "day"

[[budgets]]
name = "tenant-c-writes"
tenant = "tenant-c"
measure = "count"
cap = 10
window = "week"
"""


# Routes a refund to a human above 80 % of the tenant's day (its own cap, or the default).
NEAR = NEAR_BUDGET.replace("refunds-daily", "daily-refunds")


def caps(budgets: tuple[Budget, ...]) -> dict[str, tuple[int, str | None]]:
    return {b.name: (b.cap, b.tenant) for b in budgets}


# -- the pure resolution ----------------------------------------------------------------------


def test_a_tenants_own_budget_replaces_the_default_for_it_only(tmp_path: Path) -> None:
    budgets = load_budget_file(with_budgets(tmp_path, TENANTS))
    assert caps(budgets_for_tenant(budgets, "tenant-a")) == {"daily-refunds": (20000, "tenant-a")}
    # Other tenants keep the default; a tenant's own budget without a default is its alone.
    assert caps(budgets_for_tenant(budgets, "tenant-b")) == {"daily-refunds": (50000, None)}
    assert caps(budgets_for_tenant(budgets, "tenant-c")) == {
        "daily-refunds": (50000, None),
        "tenant-c-writes": (10, "tenant-c"),
    }
    # The order of the declarations does not matter: the tenant's own wins either way.
    reverse = tuple(reversed(budgets))
    assert caps(budgets_for_tenant(reverse, "tenant-a")) == {"daily-refunds": (20000, "tenant-a")}
    assert caps(budgets_for_tenant(reverse, "tenant-b")) == {"daily-refunds": (50000, None)}


def test_the_set_resolves_the_budgets_of_a_tenant(tmp_path: Path) -> None:
    policies = PolicySet.from_directory(with_budgets(tmp_path, TENANTS))
    assert len(policies.budgets) == 3  # all of them travel with the set
    assert [b.cap for b in policies.budgets_for("tenant-a")] == [20000]
    assert [b.cap for b in policies.budgets_for("tenant-b")] == [50000]


def test_one_budget_per_name_and_tenant() -> None:
    default, own = budget(), budget(tenant="tenant-a", cap=1)
    # A default and a tenant's own of one name, or two tenants' own: fine.
    budgets, problems = check_budgets(
        [default.document(), own.document(), budget(tenant="tenant-b").document()], source="x"
    )
    assert problems == () and len(budgets) == 3
    with pytest.raises(
        ConfigurationError,
        match=(
            r'^x: budget "refunds-daily" \(tenant tenant-a\): '
            r"declared twice \(also at budget #2\)"
        ),
    ):
        parse_budgets([default.document(), own.document(), own.document()], source="x")


def test_a_duplicate_in_a_file_is_named_at_its_line(tmp_path: Path) -> None:
    twice = TENANTS + "\n[[budgets]]" + TENANTS.split("[[budgets]]")[2]
    with pytest.raises(ConfigurationError) as refused:
        load_budget_file(with_budgets(tmp_path, twice))
    path = tmp_path / "policies" / "budgets.toml"
    assert str(refused.value) == (
        f'{path}:24: budget "daily-refunds" (tenant tenant-a): declared twice '
        "(also at line 9); one budget per name and tenant"
    )


def test_a_budget_without_a_tenant_keeps_its_form_and_the_sets_version(tmp_path: Path) -> None:
    # `tenant` is left out of a default's declaration: a set without tenants' own budgets
    # hashes (and travels) exactly as before.
    assert "tenant" not in budget().document()
    assert '"tenant"' not in canonical_budgets([budget()])
    assert budget(tenant="tenant-a").document()["tenant"] == "tenant-a"


def test_a_tenants_own_budget_travels_on_the_policies_topic(tmp_path: Path) -> None:
    settings = Settings()
    plain = PolicySet.from_directory()
    budgeted = PolicySet.from_directory(with_budgets(tmp_path, TENANTS))
    feed = PolicyFeed(settings, plain)
    feed.apply(policy_record(settings, budgeted).to_bytes())
    assert feed.current.version == budgeted.version
    assert [b.cap for b in feed.current.budgets_for("tenant-a")] == [20000]


@pytest.mark.parametrize("cap", ["200.00", 200.0, "20000"])
def test_a_cap_is_an_integer_as_written(cap: object) -> None:
    # "200.00" (a string) or 200.0 (a float) is not read as 200 minor units (2.00).
    with pytest.raises(ConfigurationError, match=r'budget "refunds-daily": cap: '):
        parse_budgets([{**budget().document(), "cap": cap}], source="x")


@pytest.mark.parametrize("tenant", ["", "tenant a", "x" * 65])
def test_a_tenant_name_is_checked(tenant: str) -> None:
    with pytest.raises(ConfigurationError, match=r"budget \"refunds-daily\".*: tenant: "):
        parse_budgets([{**budget().document(), "tenant": tenant}], source="x")


# -- errors: the real problem first, the budget by name ---------------------------------------


def test_a_bad_budget_is_named_with_its_tenant_file_and_line(tmp_path: Path) -> None:
    broken = TENANTS.replace('cap = 20000\nwindow = "day"', 'cap = 20000\nwindow = "fortnight"')
    with pytest.raises(ConfigurationError) as refused:
        load_budget_file(with_budgets(tmp_path, broken))
    path = tmp_path / "policies" / "budgets.toml"
    assert str(refused.value).startswith(
        f'{path}:15: budget "daily-refunds" (tenant tenant-a): window: Input should be'
    )
    # The line of the table when the problem is a key that is missing.
    missing = TENANTS.replace("cap = 20000\n", "")
    with pytest.raises(
        ConfigurationError, match=r'budgets.toml:9: budget "daily-refunds" \(tenant '
    ):
        load_budget_file(with_budgets(tmp_path / "m", missing))


def test_a_budget_without_a_name_is_named_by_its_position(tmp_path: Path) -> None:
    nameless = TENANTS.replace('name = "tenant-c-writes"\n', "")
    with pytest.raises(ConfigurationError, match=r"budgets.toml:17: budget #3 \(tenant tenant-c\)"):
        load_budget_file(with_budgets(tmp_path, nameless))
    # JSON has no lines: the file and the name.
    json_form = '{"budgets": [{"name": "n", "measure": "count", "cap": -1, "window": "day"}]}'
    with pytest.raises(ConfigurationError, match=r'budgets.json: budget "n": cap: '):
        load_budget_file(with_budgets(tmp_path / "j", json_form, "budgets.json"))


def test_policy_check_puts_the_bad_budget_first_without_its_knock_ons(tmp_path: Path) -> None:
    # A policy naming the budget, and the schema generated while the budgets were good.
    directory = budgeted_directory(tmp_path, NEAR, budgets=TENANTS)
    assert check_policy_directory(directory, catalog) == []
    # Breaking the tenant's budget: its own problem, and neither the schema drift nor the
    # policy naming the budget (both knock-ons of the bad budget).
    text = (directory / "budgets.toml").read_text(encoding="utf-8")
    (directory / "budgets.toml").write_text(
        text.replace("cap = 20000", 'cap = "200.00"'), encoding="utf-8"
    )
    problems = [str(p) for p in check_policy_directory(directory, catalog)]
    assert problems == [
        f'{directory / "budgets.toml"}:14: budget "daily-refunds" (tenant tenant-a): '
        "cap: Input should be a valid integer"
    ]
    # The set as a service loads it, and the budgets `ratifier policy schema` generates the
    # schema with (not a schema without them): the same error first.
    for load in (PolicySet.from_directory, directory_budgets):
        with pytest.raises(ConfigurationError, match=r'^\S+budgets.toml:14: budget "daily-refun'):
            load(directory)
    # Every declaration of the name the policy uses broken: still only the budgets' problems.
    (directory / "budgets.toml").write_text(
        text.replace("cap = 20000", 'cap = "200.00"').replace("cap = 50000", "cap = 500.00"),
        encoding="utf-8",
    )
    problems = [str(p) for p in check_policy_directory(directory, catalog)]
    assert [p.partition(": ")[2][:42] for p in problems] == [
        'budget "daily-refunds": cap: Input should ',
        'budget "daily-refunds" (tenant tenant-a): ',
    ]


def test_policy_check_still_reports_a_real_drift_after_the_bad_budget(tmp_path: Path) -> None:
    directory = budgeted_directory(tmp_path, NEAR, budgets=TENANTS)
    schema = (directory / "schema.cedarschema.json").read_text(encoding="utf-8")
    (directory / "schema.cedarschema.json").write_text(
        schema.replace('"sub"', '"subject"'), encoding="utf-8"
    )
    text = (directory / "budgets.toml").read_text(encoding="utf-8")
    (directory / "budgets.toml").write_text(text.replace('"week"', '"month"'), encoding="utf-8")
    problems = [str(p) for p in check_policy_directory(directory, catalog)]
    assert 'budget "tenant-c-writes" (tenant tenant-c): window' in problems[0]
    assert "differs from the schema generated" in problems[1]


# -- what each tenant is shown -----------------------------------------------------------------


def request_of(tenant: str) -> AuthorizationRequest:
    tool = catalog.get("propose_refund")
    assert tool is not None
    return AuthorizationRequest(
        actor=Actor(tenant=tenant, sub="bot", roles=("refund",)),
        tool=tool,
        resource=None,
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
    )


def test_context_budgets_has_the_same_names_for_every_tenant_and_its_own_cap(
    tmp_path: Path,
) -> None:
    directory = budgeted_directory(tmp_path, NEAR, budgets=TENANTS)
    policies = PolicySet.from_directory(directory)
    generated = generate_schema(catalog, policies.budgets).schema[""]["actions"]
    refund_context = generated["propose_refund"]["appliesTo"]["context"]["attributes"]
    assert sorted(refund_context["budgets"]["attributes"]) == ["daily-refunds", "tenant-c-writes"]

    def seen(tenant: str) -> dict[str, Any]:
        record = budgets_record(request_of(tenant), policies)
        assert record is not None
        return {n: s["cap"] for n, s in record.items()}

    assert seen("tenant-a") == {"daily-refunds": 20000, "tenant-c-writes": UNCAPPED}
    assert seen("tenant-b") == {"daily-refunds": 50000, "tenant-c-writes": UNCAPPED}
    assert seen("tenant-c") == {"daily-refunds": 50000, "tenant-c-writes": 10}


def test_ratifier_budgets_shows_the_tenants_own_budget(tmp_path: Path) -> None:
    from ratifier.budgets import describe_budgets

    budgets = load_budget_file(with_budgets(tmp_path, TENANTS))
    now = datetime(2026, 12, 2, 10, tzinfo=UTC)
    mine = describe_budgets(budgets, [], tenant="tenant-a", now=now)
    assert mine[0].startswith(
        "daily-refunds (tenant tenant-a's own, replaces the default cap 50000): "
        "sum:amount_minor <= 20000 per day in UTC"
    )
    assert len(mine) == 2  # and its window: no other tenant's budget
    others = describe_budgets(budgets, [], tenant="tenant-b", now=now)
    assert others[0].startswith("daily-refunds: sum:amount_minor <= 50000 per day")
    assert len(others) == 2
    c = describe_budgets(budgets, [], tenant="tenant-c", now=now)
    assert c[2].startswith("tenant-c-writes (tenant tenant-c's own, no default): count <= 10")


def test_the_dashboard_shows_the_budgets_in_force_for_the_tenant(tmp_path: Path) -> None:
    policies = PolicySet.from_directory(with_budgets(tmp_path, TENANTS))
    now = datetime(2026, 12, 2, 10, tzinfo=UTC)
    panel = budgets_panel(policies.budgets_for("tenant-a"), [], now=now)
    assert [(b["name"], b["cap"], b["tenant_specific"]) for b in panel] == [
        ("daily-refunds", 20000, True)
    ]
    panel = budgets_panel(policies.budgets_for("tenant-b"), [], now=now)
    assert [(b["name"], b["cap"], b["tenant_specific"]) for b in panel] == [
        ("daily-refunds", 50000, False)
    ]


def test_the_authorizers_view_reads_the_tenants_own_window_and_cap(tmp_path: Path) -> None:
    from streams.budget_view import charges_of

    policies = PolicySet.from_directory(budgeted_directory(tmp_path, NEAR, budgets=TENANTS))
    now = datetime(2026, 12, 2, 10, tzinfo=UTC)
    charges = charges_of([request_of("tenant-a"), request_of("tenant-b")], policies, now)
    assert [(c.index, c.name, c.cap, c.window.tenant) for c in charges] == [
        (0, "daily-refunds", 20000, "tenant-a"),
        (1, "daily-refunds", 50000, "tenant-b"),
    ]
