"""Admission limits: rate (sustained + burst) and concurrency (calls in flight) per tenant,
per agent (the context's ``sub``), per tool and per tenant and tool; priority classes.

Declared beside the policies (``limits.toml`` or ``limits.json`` in the policy directory)
and distributed with the policy set on the `policies` topic, so ``ratifier policy publish``
changes them at run time. Everything here is pure: which buckets a call draws from, its
class, and whether load shedding refuses it; the fleet-wide counting is
``streams/limiter.py`` (token buckets in Redis, one Lua script per batch).

A rule without ``tenant`` is the default for every tenant (each tenant still has its own
buckets); a rule naming the tenant replaces the default for it. A ``tool`` rule without a
tenant is one bucket for the tool across all tenants (a provider's capacity).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.envelopes import Effect
from schemas.errors import ConfigurationError

LIMIT_FILES = ("limits.toml", "limits.json")

LimitScope = Literal["tenant", "agent", "tool", "tenant_tool"]


class Priority(StrEnum):
    """Admission classes, highest first. Shedding refuses the lowest class first."""

    INTERACTIVE = "interactive"
    BULK = "bulk"


class Limit(BaseModel):
    """One declared limit. ``rate``/``burst``: a token bucket (calls per second sustained,
    ``burst`` calls at once; default ``burst`` = ``rate``); ``concurrency``: calls admitted
    and not yet ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: LimitScope
    tenant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    tool: str | None = Field(default=None, min_length=1, max_length=128)
    rate: float | None = Field(default=None, gt=0)
    burst: float | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> Limit:
        if self.rate is None and self.concurrency is None:
            raise ValueError("a limit needs 'rate' and/or 'concurrency'")
        if self.burst is not None and self.rate is None:
            raise ValueError("'burst' needs 'rate'")
        if (self.scope in ("tool", "tenant_tool")) != (self.tool is not None):
            raise ValueError("'tool' is required with scope tool / tenant_tool and only there")
        return self

    @property
    def capacity(self) -> float:
        return self.burst if self.burst is not None else (self.rate or 0.0)


class ClassRule(BaseModel):
    """Calls matching every given field are of ``priority`` (first matching rule wins)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    priority: Priority
    tenant: str | None = None
    tool: str | None = None
    agent: str | None = None
    effect: Effect | None = None

    def matches(self, call: CallScope) -> bool:
        return (
            (self.tenant is None or self.tenant == call.tenant)
            and (self.tool is None or self.tool == call.tool)
            and (self.agent is None or self.agent == call.agent)
            and (self.effect is None or self.effect is call.effect)
        )


class LimitSet(BaseModel):
    """Everything ``limits.toml`` declares."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: tuple[Limit, ...] = ()
    classes: tuple[ClassRule, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.limits and not self.classes

    def canonical(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


NO_LIMITS = LimitSet()


@dataclass(frozen=True, kw_only=True)
class CallScope:
    """What admission knows of a call: who (verified context), which tool, its effect."""

    call_id: str
    tenant: str
    agent: str
    tool: str
    effect: Effect
    # False: the context did not verify; ``tenant`` is the token's unverified claim ("" when
    # it names none), for its forged-call bucket only (:class:`Unverified`).
    verified: bool = True


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """One fleet-wide counter a call draws from: its Redis key suffix and its limit."""

    key: str
    rate: float | None
    capacity: float
    concurrency: int | None


def _key(limit: Limit, call: CallScope) -> str:
    match limit.scope:
        case "tenant":
            return f"tenant:{call.tenant}"
        case "agent":
            return f"agent:{call.tenant}:{call.agent}"
        case "tool":
            return (
                f"tool:{call.tool}" if limit.tenant is None else f"tool:{call.tenant}:{call.tool}"
            )
        case _:
            return f"tenant_tool:{call.tenant}:{call.tool}"


def buckets_of(limits: LimitSet, call: CallScope) -> tuple[Bucket, ...]:
    """The buckets ``call`` draws from: per scope (and tool), the rule naming its tenant,
    else the default rule."""
    chosen: dict[tuple[str, str | None], Limit] = {}
    for limit in limits.limits:
        if limit.tenant is not None and limit.tenant != call.tenant:
            continue
        if limit.tool is not None and limit.tool != call.tool:
            continue
        slot = (limit.scope, limit.tool)
        if slot not in chosen or limit.tenant is not None:
            chosen[slot] = limit
    return tuple(
        Bucket(
            key=_key(limit, call),
            rate=limit.rate,
            capacity=limit.capacity,
            concurrency=limit.concurrency,
        )
        for limit in chosen.values()
    )


# Bucket keys of the calls whose context does not verify (issue 45): one per claimed tenant
# and one for the whole fleet, apart from every verified tenant's buckets (those keys start
# with a scope name: ``tenant:``, ``agent:``, ``tool:``, ``tenant_tool:``).
UNVERIFIED_KEY = "unverified:"
UNVERIFIED_FLEET_KEY = f"{UNVERIFIED_KEY}*fleet*"


@dataclass(frozen=True, kw_only=True)
class Unverified:
    """The buckets of calls whose context token does not verify (forged, expired, of another
    deployment): they are refused ``rate_limited`` once these are empty, so that a flood of
    them is refused at admission, cheaply, instead of one by one by the authorizer, and never
    spends a verified tenant's tokens. ``rate``/``burst``: per claimed tenant (the token's
    unverified ``tenant`` claim); ``fleet_rate``/``fleet_burst``: all of them together (a
    forger changing the claimed tenant with each call gets no more than this)."""

    rate: float
    burst: float
    fleet_rate: float
    fleet_burst: float

    def buckets(self, claimed: str) -> tuple[Bucket, ...]:
        """Pure: the buckets an unverified call claiming tenant ``claimed`` draws from."""
        return (
            Bucket(
                key=f"{UNVERIFIED_KEY}tenant:{claimed}",
                rate=self.rate,
                capacity=self.burst,
                concurrency=None,
            ),
            Bucket(
                key=UNVERIFIED_FLEET_KEY,
                rate=self.fleet_rate,
                capacity=self.fleet_burst,
                concurrency=None,
            ),
        )


def priority_of(limits: LimitSet, call: CallScope) -> Priority:
    for rule in limits.classes:
        if rule.matches(call):
            return rule.priority
    return Priority.INTERACTIVE


@dataclass(frozen=True, kw_only=True)
class Shedding:
    """Load shedding by downstream lag (records not yet read by the next stages)."""

    lag: int
    bulk_bound: int  # above it, bulk calls are refused
    all_bound: int  # above it, every call is refused
    retry_after: float

    def refuses(self, priority: Priority) -> bool:
        if self.lag > self.all_bound:
            return True
        return priority is Priority.BULK and self.lag > self.bulk_bound


def parse_limits(document: Mapping[str, Any], *, source: str) -> LimitSet:
    try:
        return LimitSet.model_validate(dict(document))
    except ValidationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from exc


def load_limit_file(directory: Path) -> LimitSet:
    """The limits declared in ``directory`` (none when it has no limits file)."""
    found = [directory / name for name in LIMIT_FILES if (directory / name).is_file()]
    if not found:
        return NO_LIMITS
    if len(found) > 1:
        raise ConfigurationError(f"{directory}: one of {LIMIT_FILES}, not both")
    path = found[0]
    try:
        text = path.read_text(encoding="utf-8")
        document = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise ConfigurationError(f"{path}: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigurationError(f"{path}: not a table")
    return parse_limits(document, source=str(path))


def describe(limits: LimitSet) -> Sequence[str]:
    """One line per declared limit and class rule (`ratifier limits`)."""
    lines = []
    for limit in limits.limits:
        who = limit.tenant or "every tenant"
        what = f"{limit.scope}" + (f" {limit.tool}" if limit.tool else "")
        parts = []
        if limit.rate is not None:
            parts.append(f"{limit.rate:g}/s burst {limit.capacity:g}")
        if limit.concurrency is not None:
            parts.append(f"{limit.concurrency} in flight")
        lines.append(f"{what:<32} {who:<16} {', '.join(parts)}")
    for rule in limits.classes:
        match = {k: v for k, v in rule.model_dump(mode="json").items() if v and k != "priority"}
        lines.append(f"class {rule.priority.value:<26} {match or 'every call'}")
    return lines
