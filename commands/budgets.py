"""Spending budgets: caps on the sum of a numeric argument (``sum:amount_minor``) or on the
count of calls, per tenant and optionally per agent, subject and tool, per window (a calendar
day or week in a named time zone, or the last N hours).

Declared beside the policies (``budgets.toml`` or ``budgets.json`` in the policy directory)
and distributed with the policy set, so they change at run time like policies. Everything
here is pure: the executor's commit transaction locks the window, sums its reservations and
asks :func:`budget_decision` (docs/budgets.md).

A budget without ``tenant`` is the default for every tenant (each tenant still has its own
windows); a budget naming a tenant replaces the default of the same name for that tenant
(:func:`budgets_for_tenant`), as a rule naming a tenant does in limits.toml.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from commands.catalog import Tool
from schemas.envelopes import Effect
from schemas.errors import ConfigurationError

BUDGET_FILES = ("budgets.toml", "budgets.json")
# The key both file forms list their budgets under.
BUDGETS_KEY = "budgets"
# A rolling window's key: its reservations are summed by time, not by key.
ROLLING_KEY = "rolling"
_MEASURE = re.compile(r"^(count|sum:[A-Za-z_][A-Za-z0-9_]*)$")

ScopeKey = Literal["tenant", "agent", "subject", "tool"]
WindowKind = Literal["day", "week", "rolling"]


class Budget(BaseModel):
    """One budget as declared. The tenant is always part of its scope: every tenant has its
    own windows. Without ``tenant`` it is the default for every tenant; with it, it is that
    tenant's own and replaces the default of the same ``name`` for it (as in limits.toml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    # The one tenant this budget is for (None: the default for every tenant).
    tenant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # The tools whose calls count; empty: every write tool.
    tools: tuple[str, ...] = ()
    # Scope beyond the tenant: the agent (the actor's sub), the subject (the owner of the
    # resource the call acts on) and/or the tool.
    per: tuple[ScopeKey, ...] = ()
    measure: str = Field(pattern=_MEASURE.pattern)
    # In the measure's unit (minor units for a sum of amounts): an integer as written, never
    # a string or a float converted ("500.00" would otherwise be read as 500).
    cap: int = Field(ge=0, strict=True)
    window: WindowKind
    time_zone: str = "UTC"
    rolling_hours: int | None = Field(default=None, ge=1, le=24 * 366, strict=True)

    @model_validator(mode="after")
    def _consistent(self) -> Budget:
        if (self.window == "rolling") != (self.rolling_hours is not None):
            raise ValueError("rolling_hours is required with window 'rolling' and only there")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {self.time_zone!r}") from exc
        return self

    @property
    def argument(self) -> str | None:
        """The argument whose value is summed (None: a count of calls)."""
        return self.measure.partition(":")[2] or None

    def amount_of(self, tool: str, arguments: Mapping[str, Any]) -> int | None:
        """What one call of ``tool`` with ``arguments`` takes from this budget; None when the
        budget does not apply to it (another tool, or a sum whose argument is missing or not
        an integer)."""
        if self.tools and tool not in self.tools:
            return None
        if self.argument is None:
            return 1
        value = arguments.get(self.argument)
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return max(value, 0)  # a negative amount never credits a budget

    def scope_key(self, *, agent: str, subject: str | None, tool: str) -> str:
        """The window's scope beyond the tenant, as one stable string."""
        parts = {"agent": agent, "subject": subject or "-", "tool": tool}
        return "|".join(f"{k}={parts[k]}" for k in sorted(set(self.per) - {"tenant"})) or "*"

    def document(self) -> dict[str, Any]:
        """The declaration as it travels on the `policies` topic."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True, kw_only=True)
class WindowSpan:
    """The window a moment falls in: its key, where its sum starts and when it resets."""

    key: str
    # Reservations made at or after this moment count (rolling windows; else the start).
    since: datetime
    # The end of a calendar window; None for a rolling one (it depends on what is in it).
    resets_at: datetime | None


def window_of(budget: Budget, now: datetime) -> WindowSpan:
    """The window of ``budget`` that ``now`` (aware) falls in. Calendar windows are
    wall-clock days or ISO weeks (Monday first) in the budget's time zone, so a day across a
    DST change has 23 or 25 hours."""
    if budget.window == "rolling":
        assert budget.rolling_hours is not None
        return WindowSpan(
            key=ROLLING_KEY, since=now - timedelta(hours=budget.rolling_hours), resets_at=None
        )
    zone = ZoneInfo(budget.time_zone)
    local = now.astimezone(zone).date()
    if budget.window == "day":
        start, end = local, local + timedelta(days=1)
        key = f"day:{local.isoformat()}"
    else:
        start = local - timedelta(days=local.weekday())
        end = start + timedelta(days=7)
        year, week, _ = local.isocalendar()
        key = f"week:{year}-W{week:02d}"
    return WindowSpan(
        key=f"{key}@{budget.time_zone}",
        since=_midnight(start, zone),
        resets_at=_midnight(end, zone),
    )


def _midnight(day: date, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


def resets_at(budget: Budget, span: WindowSpan, oldest: datetime | None) -> datetime | None:
    """When the window frees something: a calendar window's end; for a rolling window, when
    its oldest counted reservation leaves it (None: nothing is counted)."""
    if span.resets_at is not None:
        return span.resets_at
    if oldest is None or budget.rolling_hours is None:
        return None
    return oldest + timedelta(hours=budget.rolling_hours)


@dataclass(frozen=True, kw_only=True)
class BudgetExceeded:
    """A call that does not fit: which budget, what is left, when it resets."""

    budget: str
    measure: str
    cap: int
    remaining: int
    requested: int
    resets_at: datetime | None
    time_zone: str

    def message(self) -> str:
        """Safe for the model: its own budget's name, cap, remainder and reset time only."""
        unit = "calls" if self.measure == "count" else self.measure.partition(":")[2]
        reset = (
            self.resets_at.astimezone(ZoneInfo(self.time_zone)).isoformat(timespec="seconds")
            if self.resets_at is not None
            else "when earlier calls leave the window"
        )
        return (
            f"Budget {self.budget} exceeded: this call needs {self.requested} {unit}, "
            f"{self.remaining} of {self.cap} remain in this window; it resets at {reset}."
        )


def budget_decision(
    budget: Budget, *, used: int, amount: int, resets: datetime | None
) -> BudgetExceeded | None:
    """None when ``amount`` fits beside ``used`` under the cap; else why not."""
    if used + amount <= budget.cap:
        return None
    return BudgetExceeded(
        budget=budget.name,
        measure=budget.measure,
        cap=budget.cap,
        remaining=max(budget.cap - used, 0),
        requested=amount,
        resets_at=resets,
        time_zone=budget.time_zone,
    )


@dataclass(frozen=True, kw_only=True)
class BudgetProblem:
    """What is wrong with a budgets file: where (the file, and the line when it is known;
    0: not known) and what, naming the budget by its ``name`` (and tenant) first."""

    source: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.message}"


def budget_label(document: Mapping[str, Any], position: int) -> str:
    """How an error names a budget: ``budget "daily-refunds" (tenant tenant-a)``; by its
    position (``budget #2``) only when it has no usable name."""
    name, tenant = document.get("name"), document.get("tenant")
    label = (
        f"budget {json.dumps(name)}"
        if isinstance(name, str) and name.strip()
        else f"budget #{position}"
    )
    if isinstance(tenant, str) and tenant:
        label += f" (tenant {tenant})"
    return label


# Lines of a budgets.toml: per ``[[budgets]]`` table, the line of its header ("") and of each
# of its keys.
BudgetLines = Sequence[Mapping[str, int]]
_TABLE = re.compile(r"^\s*\[\[\s*budgets\s*\]\]\s*(#.*)?$")
_ANY_TABLE = re.compile(r"^\s*\[")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def toml_budget_lines(text: str) -> list[dict[str, int]]:
    """Where each ``[[budgets]]`` table of ``text`` and its keys are (1-based lines)."""
    tables: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if _TABLE.match(line):
            current = {"": number}
            tables.append(current)
        elif _ANY_TABLE.match(line):
            current = None
        elif current is not None and (key := _KEY.match(line)):
            current.setdefault(key.group(1), number)
    return tables


def check_budgets(
    documents: Sequence[Mapping[str, Any]], *, source: str, lines: BudgetLines = ()
) -> tuple[tuple[Budget, ...], tuple[BudgetProblem, ...]]:
    """The budgets that parse (sorted by name, then tenant) and each problem: a budget that
    does not parse (named by its ``name``, at the line of the first bad key when ``lines``
    has them), and a (name, tenant) declared twice."""
    where = list(lines) if len(lines) == len(documents) else [{} for _ in documents]
    budgets: list[Budget] = []
    problems: list[BudgetProblem] = []
    first: dict[tuple[str, str | None], int] = {}
    for i, document in enumerate(documents):
        label, at = budget_label(document, i + 1), where[i]
        try:
            found = Budget.model_validate(dict(document))
        except ValidationError as exc:
            errors = exc.errors()
            keys = [str(e["loc"][0]) for e in errors if e["loc"]]
            problems.append(
                BudgetProblem(
                    source=source,
                    line=next((at[k] for k in keys if k in at), at.get("", 0)),
                    message=f"{label}: "
                    + "; ".join(
                        f"{'.'.join(str(p) for p in e['loc']) or '-'}: {e['msg']}" for e in errors
                    ),
                )
            )
            continue
        identity = (found.name, found.tenant)
        if identity in first:
            earlier = where[first[identity]].get("", 0)
            also = f"line {earlier}" if earlier else f"budget #{first[identity] + 1}"
            problems.append(
                BudgetProblem(
                    source=source,
                    line=at.get("", 0),
                    message=(
                        f"{label}: declared twice (also at {also}); one budget per name "
                        + ("and tenant" if found.tenant else "without a tenant")
                    ),
                )
            )
            continue
        first[identity] = i
        budgets.append(found)
    return tuple(sorted(budgets, key=lambda b: (b.name, b.tenant or ""))), tuple(problems)


def parse_budgets(
    documents: Sequence[Mapping[str, Any]], *, source: str, lines: BudgetLines = ()
) -> tuple[Budget, ...]:
    """Budgets from their declarations; bad ones raise `ConfigurationError` naming each
    (see `check_budgets`)."""
    budgets, problems = check_budgets(documents, source=source, lines=lines)
    if problems:
        raise ConfigurationError("; ".join(str(p) for p in problems))
    return budgets


def budgets_for_tenant(budgets: Sequence[Budget], tenant: str) -> tuple[Budget, ...]:
    """The budgets in force for ``tenant``, in the order of ``budgets`` (a set's are sorted
    by name): per name, the one naming the tenant, else the default (no tenant); a budget
    naming another tenant never applies."""
    chosen: dict[str, Budget] = {}
    for budget in budgets:
        if budget.tenant is not None and budget.tenant != tenant:
            continue
        if budget.name not in chosen or budget.tenant is not None:
            chosen[budget.name] = budget
    return tuple(chosen.values())


@dataclass(frozen=True, kw_only=True)
class BudgetFile:
    """A policy directory's budgets file as read: its budgets, or what is wrong with it."""

    path: Path | None  # None: the directory has no budgets file
    budgets: tuple[Budget, ...] = ()
    problems: tuple[BudgetProblem, ...] = ()


def read_budget_file(directory: Path) -> BudgetFile:
    """The budgets of a policy directory and every problem of its budgets file (each bad
    budget named, with its line in a budgets.toml)."""
    found = [directory / name for name in BUDGET_FILES if (directory / name).is_file()]
    if not found:
        return BudgetFile(path=None)
    path = found[0]

    def refused(message: str, line: int = 0) -> BudgetFile:
        return BudgetFile(
            path=path, problems=(BudgetProblem(source=str(path), line=line, message=message),)
        )

    if len(found) > 1:
        return refused(f"{directory} has both budgets.toml and budgets.json")
    try:
        text = path.read_text(encoding="utf-8")
        content = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        return refused(f"does not parse: {exc}")
    if not isinstance(content, dict) or set(content) - {BUDGETS_KEY}:
        return refused(f"only a list under {BUDGETS_KEY!r} is allowed")
    listed = content.get(BUDGETS_KEY, [])
    if not isinstance(listed, list) or not all(isinstance(b, dict) for b in listed):
        return refused(f"{BUDGETS_KEY!r} must be a list of tables")
    lines = toml_budget_lines(text) if path.suffix == ".toml" else []
    budgets, problems = check_budgets(listed, source=str(path), lines=lines)
    return BudgetFile(path=path, budgets=budgets, problems=problems)


def load_budget_file(directory: Path) -> tuple[Budget, ...]:
    """The budgets of a policy directory (none without a budgets file); a file with any
    problem raises `ConfigurationError` naming each, the bad budget by its name first."""
    read = read_budget_file(directory)
    if read.problems:
        raise ConfigurationError("; ".join(str(p) for p in read.problems))
    return read.budgets


def canonical_budgets(budgets: Sequence[Budget]) -> str:
    """The budgets as canonical JSON (part of the policy set's content hash)."""
    return json.dumps([b.document() for b in budgets], sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class BudgetStanding:
    """One budget's current window for one call's scope, as Cedar policies see it in
    ``context.budgets["<name>"]`` (docs/budgets.md, "Budgets in Cedar policies"). Integers
    only: Cedar has no floats. An early view: the executor's commit-time check decides."""

    name: str
    used: int  # consumed plus reserved
    reserved: int  # the part of ``used`` held for calls not yet settled
    cap: int

    @property
    def percent_used(self) -> int:
        """Whole percent of the cap used, rounded down (a cap of 0: 100 once declared)."""
        if self.cap <= 0:
            return 100
        return self.used * 100 // self.cap

    def cedar(self) -> dict[str, int | str]:
        return {
            "name": self.name,
            "used": self.used,
            "reserved": self.reserved,
            "cap": self.cap,
            "percent_used": self.percent_used,
        }


def budgets_of_tool(budgets: Sequence[Budget], tool: Tool) -> tuple[Budget, ...]:
    """The budgets a call of ``tool`` can fall under: those naming it, and those naming no
    tool when it is a write (plain reads have no ledger entry and are never budgeted)."""
    write = not (tool.effect is Effect.READ and tool.external is None)
    return tuple(b for b in budgets if tool.name in b.tools or (not b.tools and write))


# The cap ``context.budgets`` shows for a budget that is not in force for the call's tenant
# (another tenant's own budget, with no default of its name) or does not apply to its tool:
# Cedar's largest Long, nothing caps it.
UNCAPPED = 2**63 - 1


# Usage in one window: scope key → (used, reserved), as read by the authorizer's view.
WindowUsageByScope = Mapping[str, tuple[int, int]]


def standing_of(
    budget: Budget, usage: WindowUsageByScope, *, agent: str, subject: str | None, tool: str
) -> BudgetStanding:
    """``budget``'s standing for one call's scope in a window whose usage is ``usage``."""
    used, reserved = usage.get(budget.scope_key(agent=agent, subject=subject, tool=tool), (0, 0))
    return BudgetStanding(name=budget.name, used=used, reserved=reserved, cap=budget.cap)
