"""Authorization decisions: Cedar policies over the verified actor, the tool, the loaded
resource and the call's arguments. `authorize` is pure and is reused by the executor's
commit-time re-check."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import cedarpy

from commands.catalog import Resource, Tool
from schemas.envelopes import Actor, Effect, Route
from schemas.errors import ConfigurationError, ErrorCode

DEFAULT_POLICY_DIR = Path(__file__).parent / "policies"

# Effects that need a human's approval before they are committed.
APPROVAL_EFFECTS: frozenset[Effect] = frozenset({Effect.REVERSIBLE_WRITE, Effect.EXTERNAL_WRITE})


@dataclass(frozen=True, kw_only=True)
class PolicySet:
    """A Cedar policy text and its content hash (`policy_version`)."""

    text: str
    version: str

    @classmethod
    def from_text(cls, text: str) -> PolicySet:
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return cls(text=text, version=f"sha256:{digest}")

    @classmethod
    def from_directory(cls, directory: Path = DEFAULT_POLICY_DIR) -> PolicySet:
        files = sorted(directory.glob("*.cedar"))
        if not files:
            raise ConfigurationError(f"no *.cedar policy files in {directory}")
        text = "\n".join(f.read_text(encoding="utf-8") for f in files)
        policies = cls.from_text(text)
        policies.check()
        return policies

    def check(self) -> None:
        """Fail start-up with a readable error when the policy text does not parse."""
        try:
            cedarpy.format_policies(self.text)
        except Exception as exc:  # cedarpy raises a bare ValueError with the parse errors
            raise ConfigurationError(f"policy set does not parse: {exc}") from exc


class Verdict(StrEnum):
    PERMIT = "permit"
    DENY = "deny"


@dataclass(frozen=True, kw_only=True)
class Decision:
    verdict: Verdict
    route: Route | None
    policy_version: str
    code: ErrorCode | None = None
    reasons: tuple[str, ...] = ()

    @property
    def permitted(self) -> bool:
        return self.verdict is Verdict.PERMIT


def _uid(kind: str, ident: str) -> str:
    escaped = ident.replace("\\", "\\\\").replace('"', '\\"')
    return f'{kind}::"{escaped}"'


def cedar_request(
    *, actor: Actor, tool: Tool, resource: Resource | None, arguments: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Cedar request and entities for one call."""
    principal_id = f"{actor.tenant}/{actor.sub}"
    entities: list[dict[str, Any]] = [
        {
            "uid": {"type": "User", "id": principal_id},
            "attrs": {"tenant": actor.tenant, "sub": actor.sub, "roles": list(actor.roles)},
            "parents": [],
        }
    ]
    if resource is None:
        resource_uid = _uid("Tenant", actor.tenant)
        entities.append(
            {
                "uid": {"type": "Tenant", "id": actor.tenant},
                "attrs": {"tenant": actor.tenant},
                "parents": [],
            }
        )
    else:
        kind = resource.kind.capitalize()
        resource_id = f"{resource.tenant}/{resource.id}"
        resource_uid = _uid(kind, resource_id)
        entities.append(
            {
                "uid": {"type": kind, "id": resource_id},
                "attrs": {"tenant": resource.tenant, **resource.attributes},
                "parents": [],
            }
        )
    request = {
        "principal": _uid("User", principal_id),
        "action": _uid("Action", tool.name),
        "resource": resource_uid,
        "context": {"effect": tool.effect.value, "arguments": arguments},
    }
    return request, entities


def authorize(
    *,
    actor: Actor,
    tool: Tool,
    resource: Resource | None,
    arguments: dict[str, Any],
    policies: PolicySet,
) -> Decision:
    """May ``actor`` run ``tool`` with ``arguments`` on ``resource``? And by which route?"""
    if resource is not None and resource.tenant != actor.tenant:
        # Loaders filter by tenant already; this is the second lock on the same door.
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.NOT_FOUND,
        )
    request, entities = cedar_request(
        actor=actor, tool=tool, resource=resource, arguments=arguments
    )
    result = cedarpy.is_authorized(request, policies.text, entities)
    reasons = tuple(result.diagnostics.reasons)
    if not result.allowed:
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.POLICY_DENIED,
            reasons=reasons,
        )
    route = Route.APPROVAL if tool.effect in APPROVAL_EFFECTS else Route.AUTO
    return Decision(
        verdict=Verdict.PERMIT, route=route, policy_version=policies.version, reasons=reasons
    )
