"""Authorization decisions: Cedar policies over the verified actor, the tool, the loaded
resource and the call's arguments. `authorize` is pure and is reused by the executor's
commit-time re-check.

A policy set is the ``*.cedar`` files of a directory plus its Cedar schema
(``*.cedarschema.json``); it is validated against the schema when loaded, and its
``version`` is the content hash of both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import cedarpy

from commands.catalog import Resource, Tool
from schemas.envelopes import Actor, Effect, Route
from schemas.errors import ConfigurationError, ErrorCode

DEFAULT_POLICY_DIR = Path(__file__).parent / "policies"
SCHEMA_SUFFIX = ".cedarschema.json"

# Effects that need a human's approval before they are committed (unless a policy annotated
# `@approval("auto")` grants auto-approval).
APPROVAL_EFFECTS: frozenset[Effect] = frozenset(
    {Effect.REVERSIBLE_WRITE, Effect.EXTERNAL_WRITE, Effect.DESTRUCTIVE}
)
APPROVAL_ANNOTATION = "approval"


@dataclass(frozen=True, kw_only=True)
class PolicySet:
    """A validated Cedar policy text with its schema, annotations and content hash."""

    text: str
    schema: str
    version: str
    # Annotations of each policy, by the id Cedar reports in a decision's reasons.
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    # Parsed once: parsing dominates the cost of an evaluation.
    parsed: Any = field(default=None, repr=False, compare=False)
    parsed_schema: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_sources(cls, text: str, schema: str) -> PolicySet:
        """Parse and validate; a broken set raises `ConfigurationError` with Cedar's words."""
        try:
            parsed = json.loads(cedarpy.policies_to_json_str(text))
        except Exception as exc:  # cedarpy raises bare ValueErrors with the parse errors
            raise ConfigurationError(f"policy set does not parse: {exc}") from exc
        try:
            parsed_schema = cedarpy.Schema.from_json_str(schema)
            result = cedarpy.validate_policies(text, parsed_schema)
        except Exception as exc:
            raise ConfigurationError(f"Cedar schema is not valid: {exc}") from exc
        if not result.validation_passed:
            problems = "; ".join(str(e) for e in result.errors)
            raise ConfigurationError(f"policies do not match the Cedar schema: {problems}")
        annotations = {
            pid: dict(policy.get("annotations") or {})
            for pid, policy in parsed.get("staticPolicies", {}).items()
        }
        try:
            # Canonical schema JSON: the same set hashes the same from a file or the topic.
            schema_canonical = json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
        except ValueError as exc:
            raise ConfigurationError(f"Cedar schema is not JSON: {exc}") from exc
        digest = hashlib.sha256(f"{text}\0{schema_canonical}".encode()).hexdigest()[:16]
        return cls(
            text=text,
            schema=schema,
            version=f"sha256:{digest}",
            annotations=annotations,
            parsed=cedarpy.PolicySet.from_str(text),
            parsed_schema=parsed_schema,
        )

    @classmethod
    def from_directory(cls, directory: Path = DEFAULT_POLICY_DIR) -> PolicySet:
        policy_files = sorted(directory.glob("*.cedar"))
        schema_files = sorted(directory.glob(f"*{SCHEMA_SUFFIX}"))
        if not policy_files:
            raise ConfigurationError(f"no *.cedar policy files in {directory}")
        if len(schema_files) != 1:
            raise ConfigurationError(f"{directory} needs exactly one *{SCHEMA_SUFFIX} file")
        text = "\n".join(f.read_text(encoding="utf-8") for f in policy_files)
        return cls.from_sources(text, schema_files[0].read_text(encoding="utf-8"))

    @property
    def current(self) -> PolicySet:
        """A fixed set is its own source (see `PolicySource`)."""
        return self

    def route_for(self, effect: Effect, reasons: Sequence[str]) -> Route:
        """Approval by effect class, overridden by `@approval("auto"|"required")` on the
        policies that permitted the call ("required" wins)."""
        hints = {self.annotations.get(r, {}).get(APPROVAL_ANNOTATION) for r in reasons}
        if "required" in hints:
            return Route.APPROVAL
        if effect in APPROVAL_EFFECTS and "auto" not in hints:
            return Route.APPROVAL
        return Route.AUTO


class PolicySource(Protocol):
    """Where a process gets the policy set in force: a fixed `PolicySet`, or a
    `commands.policy_feed.PolicyFeed` that follows the `policies` topic."""

    @property
    def current(self) -> PolicySet: ...


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
    errors: tuple[str, ...] = ()

    @property
    def permitted(self) -> bool:
        return self.verdict is Verdict.PERMIT


@dataclass(frozen=True, kw_only=True)
class AuthorizationRequest:
    actor: Actor
    tool: Tool
    resource: Resource | None
    arguments: dict[str, Any]


def entity_type(kind: str) -> str:
    """Cedar entity type of a resource kind: ``refund_policy`` → ``RefundPolicy``."""
    return "".join(part.capitalize() for part in kind.split("_"))


def _uid(kind: str, ident: str) -> str:
    escaped = ident.replace("\\", "\\\\").replace('"', '\\"')
    return f'{kind}::"{escaped}"'


def _cedar_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cedar_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_cedar_value(v) for v in value]
    return value


def cedar_request(request: AuthorizationRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Cedar request and entities for one call."""
    actor, resource = request.actor, request.resource
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
        kind = entity_type(resource.kind)
        resource_id = f"{resource.tenant}/{resource.id}"
        resource_uid = _uid(kind, resource_id)
        entities.append(
            {
                "uid": {"type": kind, "id": resource_id},
                "attrs": _cedar_value({"tenant": resource.tenant, **resource.attributes}),
                "parents": [],
            }
        )
    cedar = {
        "principal": _uid("User", principal_id),
        "action": _uid("Action", request.tool.name),
        "resource": resource_uid,
        "context": {
            "effect": request.tool.effect.value,
            "arguments": _cedar_value(request.arguments),
        },
    }
    return cedar, entities


def _decide(request: AuthorizationRequest, policies: PolicySet, result: Any) -> Decision:
    reasons = tuple(result.diagnostics.reasons)
    errors = tuple(str(e) for e in result.diagnostics.errors)
    if not result.allowed:
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.POLICY_DENIED,
            reasons=reasons,
            errors=errors,
        )
    return Decision(
        verdict=Verdict.PERMIT,
        route=policies.route_for(request.tool.effect, reasons),
        policy_version=policies.version,
        reasons=reasons,
        errors=errors,
    )


def _foreign(request: AuthorizationRequest, policies: PolicySet) -> Decision | None:
    if request.resource is not None and request.resource.tenant != request.actor.tenant:
        # Loaders filter by tenant already; this is the second lock on the same door.
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.NOT_FOUND,
        )
    return None


def authorize(
    *,
    actor: Actor,
    tool: Tool,
    resource: Resource | None,
    arguments: dict[str, Any],
    policies: PolicySet,
) -> Decision:
    """May ``actor`` run ``tool`` with ``arguments`` on ``resource``? And by which route?"""
    request = AuthorizationRequest(actor=actor, tool=tool, resource=resource, arguments=arguments)
    return authorize_batch([request], policies)[0]


def authorize_batch(
    requests: Sequence[AuthorizationRequest], policies: PolicySet
) -> list[Decision]:
    """`authorize` for many calls at once: one Cedar evaluation per batch (backlogs)."""
    decisions: list[Decision | None] = [_foreign(r, policies) for r in requests]
    for group in _consistent_groups([i for i, d in enumerate(decisions) if d is None], requests):
        indexes = [i for i, _ in group]
        entities: dict[tuple[str, str], dict[str, Any]] = {}
        for _, (_, request_entities) in group:
            entities.update({(e["uid"]["type"], e["uid"]["id"]): e for e in request_entities})
        results = cedarpy.is_authorized_batch(
            [cedar for _, (cedar, _) in group],
            policies.parsed,
            list(entities.values()),
            policies.parsed_schema,
        )
        for i, result in zip(indexes, results, strict=True):
            decisions[i] = _decide(requests[i], policies, result)
    return [d for d in decisions if d is not None]


CedarCall = tuple[dict[str, Any], list[dict[str, Any]]]


def _consistent_groups(
    indexes: list[int], requests: Sequence[AuthorizationRequest]
) -> list[list[tuple[int, CedarCall]]]:
    """Split into batches whose entities agree: one batch shares one entity list, so two
    requests naming the same entity with different attributes (the same user with other
    roles, a payment re-read after a change) must not share a batch."""
    groups: list[list[tuple[int, CedarCall]]] = []
    seen: list[dict[tuple[str, str], dict[str, Any]]] = []
    for i in indexes:
        call = cedar_request(requests[i])
        keyed = {(e["uid"]["type"], e["uid"]["id"]): e for e in call[1]}
        for group, known in zip(groups, seen, strict=True):
            if all(known.get(k, e) == e for k, e in keyed.items()):
                group.append((i, call))
                known.update(keyed)
                break
        else:
            groups.append([(i, call)])
            seen.append(dict(keyed))
    return groups
