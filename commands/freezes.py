"""The kill switch: freezes of a scope (a tenant, an agent, an end user, a tool, a tenant's
writes or every tenant's writes), as records on the compacted `controls` topic, keyed by
scope (docs/kill-switch.md).

Every stage follows the topic with the group-less reader and keeps a view of it
(`feeds.freezes.FleetFreezes`, the Kafka edge; this module is pure):
the pure `frozen_scope` decides whether a call falls in a frozen scope. The authorizer asks
it for new calls, the approval-join for approvals, the executor at commit time, before the
effect starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

from pydantic import ValidationError

from schemas.envelopes import Effect, FreezeRecord
from schemas.errors import InvalidArguments

log = logging.getLogger("ratifier.freezes")

EVERY_TENANT = "*"


class ScopeKind(StrEnum):
    TENANT = "tenant"  # every call of the tenant, reads too
    AGENT = "agent"  # calls made under the identity `sub` (the verified context's sub)
    SUBJECT = "subject"  # calls acting on a resource of this end user (its owner)
    TOOL = "tool"  # calls of one tool
    WRITES = "writes"  # every effect but a read (`writes:*`: in every tenant)


@dataclass(frozen=True, kw_only=True)
class Scope:
    kind: ScopeKind
    tenant: str  # EVERY_TENANT for `writes:*`
    name: str = ""  # the agent's or subject's sub, the tool's name

    @classmethod
    def parse(cls, text: str) -> Scope:
        """A scope from its key (`tenant:T`, `agent:T:sub`, `subject:T:sub`, `tool:T:name`,
        `writes:T`, `writes:*`); `InvalidArguments` for anything else."""
        try:
            FreezeRecord.model_validate(
                {"scope": text, "frozen": True, "by": "-", "at": datetime.now(UTC)}
            )
        except ValidationError as exc:
            raise InvalidArguments(
                "A scope is tenant:T, agent:T:sub, subject:T:sub, tool:T:name, writes:T "
                "or writes:*."
            ) from exc
        kind, _, rest = text.partition(":")
        tenant, _, name = rest.partition(":")
        return cls(kind=ScopeKind(kind), tenant=tenant, name=name)

    @property
    def key(self) -> str:
        return f"{self.kind.value}:{self.tenant}" + (f":{self.name}" if self.name else "")

    @property
    def every_tenant(self) -> bool:
        return self.tenant == EVERY_TENANT


@dataclass(frozen=True, kw_only=True)
class CallFacts:
    """What a freeze is decided on: the call's tenant, the verified actor's sub, the owner of
    the resource it acts on (when known), its tool and effect."""

    tenant: str
    actor: str
    tool: str
    effect: Effect
    owner: str | None = None


@dataclass(frozen=True, kw_only=True)
class Freezes:
    """A snapshot of the scopes frozen now: scope key → the record that froze it."""

    by_scope: MappingProxyType[str, FreezeRecord] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def __len__(self) -> int:
        return len(self.by_scope)

    def records(self) -> list[FreezeRecord]:
        return sorted(self.by_scope.values(), key=lambda r: r.scope)


NO_FREEZES = Freezes()


def _candidates(facts: CallFacts) -> list[str]:
    """Every scope key the call falls in, most specific first."""
    t = facts.tenant
    keys = [f"agent:{t}:{facts.actor}", f"tool:{t}:{facts.tool}"]
    if facts.owner:
        keys.append(f"subject:{t}:{facts.owner}")
    if facts.effect is not Effect.READ:
        keys += [f"writes:{t}", f"writes:{EVERY_TENANT}"]
    keys.append(f"tenant:{t}")
    return keys


def frozen_scope(view: Freezes, facts: CallFacts) -> FreezeRecord | None:
    """The freeze that stops this call, or None (pure)."""
    if not view.by_scope:
        return None
    for key in _candidates(facts):
        found = view.by_scope.get(key)
        if found is not None:
            return found
    return None


def applied(view: Freezes, record: FreezeRecord) -> Freezes:
    """The view after ``record``: a freeze adds (or replaces) its scope, an unfreeze drops it."""
    scopes = dict(view.by_scope)
    if record.frozen:
        scopes[record.scope] = record
    else:
        scopes.pop(record.scope, None)
    return Freezes(by_scope=MappingProxyType(scopes))


class FreezeSource(Protocol):
    """Where a stage gets the freezes in force: `FleetFreezes` (following `controls`)."""

    @property
    def current(self) -> Freezes: ...


@dataclass(frozen=True)
class FixedFreezes:
    """A fixed view (tests; a stage built without the topic)."""

    current: Freezes = NO_FREEZES


def freeze_record(
    scope: Scope, *, frozen: bool, by: str, by_tenant: str | None, reason: str
) -> FreezeRecord:
    return FreezeRecord(
        scope=scope.key,
        frozen=frozen,
        by=by,
        by_tenant=by_tenant,
        reason=" ".join(reason.split())[:512],
        at=datetime.now(UTC),
    )
