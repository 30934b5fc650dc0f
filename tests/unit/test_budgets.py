"""Spending budgets: declarations, windows, the pure decision, distribution with the set."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from commands.budgets import (
    Budget,
    budget_decision,
    load_budget_file,
    parse_budgets,
    resets_at,
    window_of,
)
from commands.cedar_schema import generate_schema
from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from config.settings import Settings
from executors.budgets import UsageState, settled_state
from executors.decisions import status_for
from feeds.policies import PolicyFeed, policy_record
from schemas.envelopes import Status
from schemas.errors import ConfigurationError, ErrorCode


def budget(**overrides: Any) -> Budget:
    declared: dict[str, Any] = {
        "name": "refunds-daily",
        "tools": ["propose_refund"],
        "per": ["agent"],
        "measure": "sum:amount_minor",
        "cap": 50_000,
        "window": "day",
        "time_zone": "Europe/Berlin",
    }
    return Budget.model_validate({**declared, **overrides})


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- windows ------------------------------------------------------------------------------


def test_a_calendar_day_is_the_local_day_of_its_time_zone() -> None:
    day = budget()
    # 23:30 UTC on 1 Dec is 00:30 on 2 Dec in Berlin: the 2 Dec window.
    span = window_of(day, at("2026-12-01T23:30:00+00:00"))
    assert span.key == "day:2026-12-02@Europe/Berlin"
    assert span.since == at("2026-12-01T23:00:00+00:00")
    assert span.resets_at == at("2026-12-02T23:00:00+00:00")
    # 22:30 UTC the same evening is still 1 Dec in Berlin.
    assert window_of(day, at("2026-12-01T22:30:00+00:00")).key == "day:2026-12-01@Europe/Berlin"


def test_a_day_across_dst_has_23_or_25_hours() -> None:
    day = budget()
    spring = window_of(day, at("2026-03-29T12:00:00+00:00"))  # Berlin springs forward
    assert spring.resets_at is not None
    assert spring.resets_at - spring.since == timedelta(hours=23)
    autumn = window_of(day, at("2026-10-25T12:00:00+00:00"))  # and falls back
    assert autumn.resets_at is not None
    assert autumn.resets_at - autumn.since == timedelta(hours=25)
    assert autumn.since == at("2026-10-24T22:00:00+00:00")  # midnight CEST
    assert autumn.resets_at == at("2026-10-25T23:00:00+00:00")  # midnight CET


def test_a_calendar_week_starts_on_monday_in_its_time_zone() -> None:
    week = budget(window="week", time_zone="America/New_York")
    # Sunday 29 Nov 2026, 23:00 in New York (04:00 UTC Monday): still week 48 there.
    span = window_of(week, at("2026-11-30T04:00:00+00:00"))
    assert span.key == "week:2026-W48@America/New_York"
    assert span.since == at("2026-11-23T05:00:00+00:00")
    assert span.resets_at == at("2026-11-30T05:00:00+00:00")
    # Across the US DST change (1 Nov 2026): the week is 169 hours long.
    dst = window_of(week, at("2026-10-28T12:00:00+00:00"))
    assert dst.resets_at is not None
    assert dst.resets_at - dst.since == timedelta(hours=169)


def test_a_rolling_window_counts_the_last_n_hours() -> None:
    rolling = budget(window="rolling", rolling_hours=6, time_zone="UTC")
    now = at("2026-12-02T10:00:00+00:00")
    span = window_of(rolling, now)
    assert span.key == "rolling"
    assert span.since == at("2026-12-02T04:00:00+00:00")
    assert span.resets_at is None
    # It frees something when its oldest counted reservation leaves it.
    oldest = at("2026-12-02T05:15:00+00:00")
    assert resets_at(rolling, span, oldest) == at("2026-12-02T11:15:00+00:00")
    assert resets_at(rolling, span, None) is None


# -- scope and amounts --------------------------------------------------------------------


def test_the_scope_and_the_amount_of_a_call() -> None:
    b = budget(per=["tool", "agent", "tenant"])
    assert b.scope_key(agent="bot-1", subject="cus_1", tool="propose_refund") == (
        "agent=bot-1|tool=propose_refund"
    )
    assert budget(per=[]).scope_key(agent="a", subject=None, tool="t") == "*"
    assert budget(per=["subject"]).scope_key(agent="a", subject=None, tool="t") == "subject=-"
    assert b.amount_of("propose_refund", {"amount_minor": 250}) == 250
    assert b.amount_of("get_payment", {"amount_minor": 250}) is None  # another tool
    assert b.amount_of("propose_refund", {}) is None  # nothing to sum
    assert b.amount_of("propose_refund", {"amount_minor": True}) is None
    assert b.amount_of("propose_refund", {"amount_minor": -5}) == 0  # never a credit
    count = budget(measure="count", tools=[])
    assert count.amount_of("anything", {}) == 1


# -- the decision -------------------------------------------------------------------------


def test_a_call_fits_up_to_the_cap_exactly() -> None:
    b = budget(cap=1000)
    assert budget_decision(b, used=400, amount=600, resets=None) is None
    assert budget_decision(b, used=0, amount=1000, resets=None) is None


def test_over_the_cap_says_what_is_left_and_when_it_resets() -> None:
    b = budget(cap=50_000)
    resets = at("2026-12-02T23:00:00+00:00")
    exceeded = budget_decision(b, used=49_700, amount=301, resets=resets)
    assert exceeded is not None
    assert (exceeded.remaining, exceeded.requested, exceeded.cap) == (300, 301, 50_000)
    message = exceeded.message()
    assert "refunds-daily" in message
    assert "300 of 50000 remain" in message
    assert "needs 301 amount_minor" in message
    # The reset time in the budget's own time zone.
    assert "2026-12-03T00:00:00+01:00" in message
    assert len(message) <= 300


def test_a_count_over_its_cap_and_an_overdrawn_window() -> None:
    b = budget(measure="count", cap=3, window="rolling", rolling_hours=1, time_zone="UTC")
    exceeded = budget_decision(b, used=5, amount=1, resets=None)
    assert exceeded is not None
    assert exceeded.remaining == 0  # never negative (a cap lowered at run time)
    assert "1 calls" in exceeded.message()
    assert "when earlier calls leave the window" in exceeded.message()


def test_outcomes_consume_release_or_hold_reservations() -> None:
    assert status_for(ErrorCode.BUDGET_EXCEEDED) is Status.DENIED
    assert settled_state(Status.SUCCEEDED) == UsageState.CONSUMED
    for status in (Status.FAILED, Status.DENIED, Status.CANCELLED, Status.CONFLICT):
        assert settled_state(status) == UsageState.RELEASED
    assert settled_state(Status.UNKNOWN) is None


# -- declarations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"window": "rolling"}, "rolling_hours is required"),
        ({"rolling_hours": 4}, "rolling_hours is required"),
        ({"time_zone": "Mars/Olympus"}, "unknown time zone"),
        ({"measure": "sum:"}, "measure"),
        ({"cap": -1}, "cap"),
        ({"per": ["customer"]}, "per"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_budget_is_refused_by_name(overrides: dict[str, Any], problem: str) -> None:
    document = {**budget().document(), **overrides}
    document = {k: v for k, v in document.items() if v is not None}
    with pytest.raises(ConfigurationError, match=problem):
        parse_budgets([document], source="budgets.toml")


def test_budget_names_are_unique() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r'^x: budget "refunds-daily": declared twice \(also at budget #1\)',
    ):
        parse_budgets([budget().document(), budget().document()], source="x")


def with_budgets(tmp_path: Path, text: str, name: str = "budgets.toml") -> Path:
    directory = tmp_path / "policies"
    shutil.copytree(DEFAULT_POLICY_DIR, directory)
    (directory / "budgets.toml").unlink()
    (directory / name).write_text(text, encoding="utf-8")
    return directory


# A day's refunds per agent (test_budget_context.py uses it too).
REFUNDS_DAILY = """
[[budgets]]
name = "refunds-daily"
tools = ["propose_refund"]
per = ["agent"]
measure = "sum:amount_minor"
cap = 50000
window = "day"
time_zone = "Europe/Berlin"
"""

TOML = (
    REFUNDS_DAILY
    + """
[[budgets]]
name = "writes-hourly"
measure = "count"
cap = 100
window = "rolling"
rolling_hours = 1
"""
)


def test_budgets_load_with_the_policy_set_and_change_its_version(tmp_path: Path) -> None:
    plain = PolicySet.from_directory(DEFAULT_POLICY_DIR)
    assert plain.budgets == ()  # the reference set declares none
    budgeted = PolicySet.from_directory(with_budgets(tmp_path, TOML))
    assert [b.name for b in budgeted.budgets] == ["refunds-daily", "writes-hourly"]
    assert budgeted.text == plain.text
    assert budgeted.version != plain.version
    json_form = with_budgets(
        tmp_path / "j",
        '{"budgets": [{"name": "n", "measure": "count", "cap": 1, "window": "day"}]}',
        "budgets.json",
    )
    assert [b.cap for b in load_budget_file(json_form)] == [1]


def test_an_unparsable_budget_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not parse"):
        PolicySet.from_directory(with_budgets(tmp_path, "[[budgets]\nname ="))
    with pytest.raises(ConfigurationError, match="only a list"):
        load_budget_file(with_budgets(tmp_path / "k", "cap = 3"))


def test_budgets_travel_with_the_set_on_the_policies_topic(tmp_path: Path) -> None:
    settings = Settings()
    plain = PolicySet.from_directory(DEFAULT_POLICY_DIR)
    budgeted = PolicySet.from_directory(with_budgets(tmp_path, TOML))
    assert policy_record(settings, plain).budgets is None
    record = policy_record(settings, budgeted)
    feed = PolicyFeed(settings, plain)
    feed.apply(record.to_bytes())
    assert feed.current.version == budgeted.version
    assert feed.current.budgets == budgeted.budgets
    # A record whose budgets were changed in transit hashes to another version: refused.
    tampered = record.model_copy(
        update={"budgets": ({**budgeted.budgets[0].document(), "cap": 10**9},), "version": "x"}
    )
    other = PolicyFeed(settings, plain)
    other.apply(tampered.to_bytes())
    assert other.current.version == plain.version
    assert other.refusals


def test_a_published_record_with_a_bad_budget_is_refused(tmp_path: Path) -> None:
    settings = Settings()
    plain = PolicySet.from_directory(DEFAULT_POLICY_DIR)
    record = policy_record(settings, PolicySet.from_directory(with_budgets(tmp_path, TOML)))
    bad = record.model_copy(update={"budgets": ({"name": "x", "cap": 1},)})
    feed = PolicyFeed(settings, plain)
    feed.apply(bad.to_bytes())
    assert feed.current.version == plain.version
    assert 'budget "x": ' in feed.refusals[0].reason  # named, not numbered
    nameless = record.model_copy(update={"budgets": ({"cap": 1},)})
    feed.apply(nameless.to_bytes())
    assert "budget #1: " in feed.refusals[1].reason  # the position only without a name


def test_now_is_utc_aware_in_every_window() -> None:
    now = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    for b in (budget(), budget(window="week"), budget(window="rolling", rolling_hours=2)):
        assert window_of(b, now).since.tzinfo is not None


def test_ratifier_budgets_shows_usage_what_is_left_and_the_reset() -> None:
    from executors.budgets import WindowUsage
    from ratifier.budgets import describe_budgets

    b = budget()
    now = at("2026-12-02T10:00:00+00:00")
    used = WindowUsage(
        budget=b,
        tenant="tenant-a",
        scope_key="agent=bot-1",
        window_key="day:2026-12-02@Europe/Berlin",
        consumed=49_000,
        reserved=700,
        resets_at=at("2026-12-02T23:00:00+00:00"),
    )
    lines = describe_budgets([b, budget(name="other")], [used], tenant="tenant-a", now=now)
    assert lines[0].startswith("refunds-daily: sum:amount_minor <= 50000 per day in Europe/Berlin")
    assert "per tenant, agent" in lines[0]
    assert "agent=bot-1: used 49700 amount_minor of 50000 (700 reserved" in lines[1]
    assert "left 300" in lines[1]
    assert "resets 2026-12-03T00:00:00+01:00" in lines[1]  # in the budget's time zone
    assert "nothing used in day:2026-12-02@Europe/Berlin" in lines[3]
    assert describe_budgets([], [], tenant="t", now=now) == [
        "the policy set in force declares no budgets"
    ]


def test_policy_check_reports_budget_problems(tmp_path: Path) -> None:
    from commands.policy import check_policy_directory, directory_budgets
    from commands.reference import catalog

    def regenerated(directory: Path) -> Path:
        schema = generate_schema(catalog, directory_budgets(directory)).text()
        (directory / "schema.cedarschema.json").write_text(schema, encoding="utf-8")
        return directory

    ok = with_budgets(tmp_path / "ok", TOML)
    # A schema generated before the budgets lacks their `context.budgets`: regenerate it.
    (stale,) = check_policy_directory(ok, catalog)
    assert "differs from the schema generated" in str(stale)
    assert check_policy_directory(regenerated(ok), catalog) == []
    unknown_tool = TOML.replace('tools = ["propose_refund"]', 'tools = ["refund_everything"]')
    tool_directory = regenerated(with_budgets(tmp_path / "tool", unknown_tool))
    (problem,) = check_policy_directory(tool_directory, catalog)
    assert "budget refunds-daily: no tool 'refund_everything'" in str(problem)
    # A budget broken after its schema was generated: its own problem, by name and line, and
    # not the schema drift it causes (the schema still declares its `context.budgets`).
    bad_directory = regenerated(with_budgets(tmp_path / "bad", TOML))
    broken = TOML.replace('window = "day"', 'window = "fortnight"')
    (bad_directory / "budgets.toml").write_text(broken, encoding="utf-8")
    (problem,) = check_policy_directory(bad_directory, catalog)
    assert str(problem).startswith(
        f'{bad_directory / "budgets.toml"}:8: budget "refunds-daily": window: Input should be'
    )


def test_a_set_without_budgets_is_published_as_before(tmp_path: Path) -> None:
    import json

    settings = Settings()
    plain = json.loads(policy_record(settings, PolicySet.from_directory()).to_bytes())
    assert "budgets" not in plain  # readable by workers that do not know the field
    budgeted = policy_record(settings, PolicySet.from_directory(with_budgets(tmp_path, TOML)))
    assert len(json.loads(budgeted.to_bytes())["budgets"]) == 2
