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
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import cedarpy

from commands.budgets import (
    UNCAPPED,
    Budget,
    BudgetFile,
    BudgetStanding,
    budgets_for_tenant,
    budgets_of_tool,
    canonical_budgets,
    load_budget_file,
    read_budget_file,
)
from commands.catalog import Catalog, Resource, Tool
from commands.cedar_schema import BUDGETS_CONTEXT, entity_type, generate_schema
from commands.limits import NO_LIMITS, LimitSet, load_limit_file
from schemas.envelopes import Actor, Effect, ErrorInfo, Route
from schemas.errors import ConfigurationError, ErrorCode, RefusalReason
from telemetry.metrics import count_policy_evaluation_error

log = logging.getLogger("ratifier.policies")

# The reference catalog's policies live with its domain (commands/payments/policies).
DEFAULT_POLICY_DIR = Path(__file__).parent / "payments" / "policies"
SCHEMA_SUFFIX = ".cedarschema.json"

# Effects that need a human's approval before they are committed (unless a policy annotated
# `@approval("auto")` grants auto-approval).
APPROVAL_EFFECTS: frozenset[Effect] = frozenset(
    {Effect.REVERSIBLE_WRITE, Effect.EXTERNAL_WRITE, Effect.DESTRUCTIVE}
)
APPROVAL_ANNOTATION = "approval"
# `@id("…")` names a policy in reasons, outcomes, logs and metrics (else Cedar's `policyN`);
# `@message("…")` on a `forbid` is shown to the model when that forbid refuses a call: write
# it as a fixed sentence, it is never filled in with data.
ID_ANNOTATION = "id"
MESSAGE_ANNOTATION = "message"
# `@priority("N")` (an integer, default 0) on a `forbid`: when several forbids with a
# `@message` refuse one call, the model is shown the message of the one with the highest
# priority, then of the most specific one, then of the first by `@id` (`PolicySet.message_of`).
PRIORITY_ANNOTATION = "priority"
_INTEGER = re.compile(r"^[+-]?[0-9]{1,9}$")


@dataclass(frozen=True)
class MessageRank:
    """How strongly a forbid's `@message` speaks for a refusal (higher first): its
    `@priority`, then how many of principal, action and resource its scope constrains, then
    how many conditions (`&&`-joined terms of its `when` / `unless` clauses) it has."""

    priority: int = 0
    scopes: int = 0
    conditions: int = 0


def _conjuncts(body: Any) -> int:
    if isinstance(body, dict) and isinstance(body.get("&&"), dict):
        both = body["&&"]
        return _conjuncts(both.get("left")) + _conjuncts(both.get("right"))
    return 1


def message_rank(policy: dict[str, Any]) -> MessageRank:
    """The `MessageRank` of one policy in `policies_to_json_str` form."""
    annotations = policy.get("annotations") or {}
    priority = annotations.get(PRIORITY_ANNOTATION)
    scoped = [policy.get(part) for part in ("principal", "action", "resource")]
    return MessageRank(
        priority=int(priority) if isinstance(priority, str) and _INTEGER.match(priority) else 0,
        scopes=sum(1 for scope in scoped if isinstance(scope, dict) and scope.get("op") != "All"),
        conditions=sum(_conjuncts(c.get("body")) for c in policy.get("conditions") or ()),
    )


def annotation_problems(annotations: dict[str, str]) -> list[str]:
    """What is wrong with an agent policy's annotations (`ratifier policy check`)."""
    priority = annotations.get(PRIORITY_ANNOTATION)
    if priority is not None and not _INTEGER.match(priority):
        return [f"@priority({priority!r}) is not an integer"]
    return []


@dataclass(frozen=True, kw_only=True)
class PolicySet:
    """A validated Cedar policy text with its schema, annotations and content hash."""

    text: str
    schema: str
    version: str
    # Annotations of each policy, by the id Cedar reports in a decision's reasons.
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    # The tool names each policy's action scope covers, by Cedar id (None: every action).
    action_scopes: dict[str, frozenset[str] | None] = field(default_factory=dict)
    # How each policy's `@message` ranks when several forbids refuse a call, by Cedar id.
    message_ranks: dict[str, MessageRank] = field(default_factory=dict)
    # Parsed once: parsing dominates the cost of an evaluation.
    parsed: Any = field(default=None, repr=False, compare=False)
    parsed_schema: Any = field(default=None, repr=False, compare=False)
    # Spending budgets declared beside the policies (docs/budgets.md), part of the version.
    budgets: tuple[Budget, ...] = ()
    # The budget names each action's ``context.budgets`` declares in the schema, by tool;
    # a tool absent here has no ``context.budgets`` (a schema generated before v1.5).
    budget_context: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # Admission limits declared beside the policies (commands/limits.py), part of the version.
    limits: LimitSet = NO_LIMITS
    # Cedar's answers under this set, by request and the request's entities (a pure function
    # of both): the same read of the same resource by the same agent is decided once per
    # process while the set is in force, in the authorizer and in the executor's commit-time
    # re-check alike (issue 46). Not an init field: a set made from this one starts empty.
    answers: dict[bytes, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_sources(
        cls,
        text: str,
        schema: str,
        budgets: tuple[Budget, ...] = (),
        limits: LimitSet = NO_LIMITS,
    ) -> PolicySet:
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
        static = parsed.get("staticPolicies", {})
        annotations = {pid: dict(policy.get("annotations") or {}) for pid, policy in static.items()}
        action_scopes = {pid: _action_scope(policy.get("action")) for pid, policy in static.items()}
        bad_annotations = [
            f"{pid}: {problem}"
            for pid, policy in static.items()
            for problem in annotation_problems(dict(policy.get("annotations") or {}))
        ]
        if bad_annotations:
            raise ConfigurationError(f"policy set has bad annotations: {bad_annotations}")
        try:
            # Canonical schema JSON: the same set hashes the same from a file or the topic.
            schema_canonical = json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
        except ValueError as exc:
            raise ConfigurationError(f"Cedar schema is not JSON: {exc}") from exc
        budget_context = _budget_context(json.loads(schema), budgets)
        content = f"{text}\0{schema_canonical}"
        if budgets:  # a set without budgets keeps the version it always had
            content += f"\0{canonical_budgets(budgets)}"
        if not limits.empty:  # a set without limits keeps the version it always had
            content += f"\0limits\0{limits.canonical()}"
        digest = hashlib.sha256(content.encode()).hexdigest()[:16]
        return cls(
            text=text,
            schema=schema,
            version=f"sha256:{digest}",
            annotations=annotations,
            action_scopes=action_scopes,
            message_ranks={pid: message_rank(policy) for pid, policy in static.items()},
            parsed=cedarpy.PolicySet.from_str(text),
            parsed_schema=parsed_schema,
            budgets=budgets,
            budget_context=budget_context,
            limits=limits,
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
        return cls.from_sources(
            text,
            schema_files[0].read_text(encoding="utf-8"),
            load_budget_file(directory),
            limits=load_limit_file(directory),
        )

    @property
    def current(self) -> PolicySet:
        """A fixed set is its own source (see `PolicySource`)."""
        return self

    def budgets_for(self, tenant: str) -> tuple[Budget, ...]:
        """The budgets in force for ``tenant``: its own where one replaces the default of
        the same name, else the default (docs/budgets.md, "Setting tenants apart")."""
        return budgets_for_tenant(self.budgets, tenant)

    def policy_id(self, cedar_id: str) -> str:
        """The ``@id`` of a policy, or Cedar's own id when it has none."""
        return self.annotations.get(cedar_id, {}).get(ID_ANNOTATION) or cedar_id

    def message_of(self, cedar_ids: Sequence[str]) -> str | None:
        """The ``@message`` that speaks for a refusal by the forbids ``cedar_ids``: of those
        with a message, the one of highest `MessageRank` (``@priority``, then the most
        specific scope, then the most conditions), then the first by ``@id``. Deterministic:
        it depends on the policies only, never on the order Cedar reports them in."""
        ranked = self.ranked(cedar_ids)
        return self.annotations.get(ranked[0], {}).get(MESSAGE_ANNOTATION) if ranked else None

    def ranked(self, cedar_ids: Iterable[str]) -> list[str]:
        """``cedar_ids`` from the one whose ``@message`` speaks for them (see `message_of`)
        to the last; those without a message come after those with one."""
        return sorted(
            set(cedar_ids),
            key=lambda c: (
                not self.annotations.get(c, {}).get(MESSAGE_ANNOTATION),
                _reverse(self.message_ranks.get(c, MessageRank())),
                self.policy_id(c),
                c,
            ),
        )

    def policies_for(self, tool: str) -> tuple[str, ...]:
        """Cedar ids of the policies whose action scope covers ``tool``."""
        return tuple(
            pid for pid, scope in self.action_scopes.items() if scope is None or tool in scope
        )

    def route_for(self, effect: Effect, reasons: Sequence[str]) -> Route:
        """Approval by effect class, overridden by `@approval("auto"|"required")` on the
        policies that permitted the call ("required" wins)."""
        hints = {self.annotations.get(r, {}).get(APPROVAL_ANNOTATION) for r in reasons}
        if "required" in hints:
            return Route.APPROVAL
        if effect in APPROVAL_EFFECTS and "auto" not in hints:
            return Route.APPROVAL
        return Route.AUTO


def _budget_context(schema: Any, budgets: Sequence[Budget]) -> dict[str, tuple[str, ...]]:
    """The budget names the schema puts in each action's ``context.budgets``; a name the set
    does not declare is a `ConfigurationError` (regenerate the schema: `policy schema`)."""
    declared = {b.name for b in budgets}
    found: dict[str, tuple[str, ...]] = {}
    namespaces = schema.values() if isinstance(schema, dict) else ()
    for namespace in namespaces:
        actions = namespace.get("actions", {}) if isinstance(namespace, dict) else {}
        for action, spec in actions.items():
            context = (spec.get("appliesTo") or {}).get("context") or {}
            field_spec = (context.get("attributes") or {}).get(BUDGETS_CONTEXT)
            if not isinstance(field_spec, dict):
                continue
            names = tuple(sorted(field_spec.get("attributes") or {}))
            unknown = sorted(set(names) - declared)
            if unknown:
                raise ConfigurationError(
                    f"the Cedar schema declares context.budgets {unknown} for action "
                    f"{action}, which the set's budgets do not declare; regenerate it "
                    "with `ratifier policy schema`"
                )
            found[action] = names
    return found


def _reverse(rank: MessageRank) -> tuple[int, int, int]:
    return (-rank.priority, -rank.scopes, -rank.conditions)


class PolicySource(Protocol):
    """Where a process gets the policy set in force: a fixed `PolicySet`, or a
    `feeds.policies.PolicyFeed` that follows the `policies` topic."""

    @property
    def current(self) -> PolicySet: ...


def _action_scope(scope: Any) -> frozenset[str] | None:
    """Tool names an action scope (`policies_to_json_str` form) covers; None: all."""
    if not isinstance(scope, dict) or scope.get("op") == "All":
        return None
    entities = scope.get("entities") or ([scope["entity"]] if "entity" in scope else [])
    names = [e.get("id") for e in entities if isinstance(e, dict)]
    if scope.get("op") not in ("==", "in") or not all(isinstance(n, str) for n in names):
        return None  # action groups and the like: assume it may apply
    return frozenset(n for n in names if isinstance(n, str))


class Verdict(StrEnum):
    PERMIT = "permit"
    DENY = "deny"


@dataclass(frozen=True, kw_only=True)
class Decision:
    verdict: Verdict
    route: Route | None
    policy_version: str
    code: ErrorCode | None = None
    # Cedar's ids of the policies that decided (permits when permitted, forbids otherwise).
    reasons: tuple[str, ...] = ()
    # Cedar's diagnostics (for logs and the operator, never for a model: they quote entities).
    errors: tuple[str, ...] = ()
    # Why a call was refused, and the `@id`s of the policies concerned.
    refusal: RefusalReason | None = None
    policy_ids: tuple[str, ...] = ()
    # A forbid's `@message`, safe to show the model.
    message: str | None = None

    @property
    def permitted(self) -> bool:
        return self.verdict is Verdict.PERMIT

    def error_info(self) -> ErrorInfo | None:
        """The outcome's error for a refusal (None when permitted)."""
        if self.permitted:
            return None
        return ErrorInfo.of(
            self.code or ErrorCode.POLICY_DENIED,
            self.message,
            reason=self.refusal,
            policies=self.policy_ids,
        )


@dataclass(frozen=True, kw_only=True)
class AuthorizationRequest:
    actor: Actor
    tool: Tool
    resource: Resource | None
    arguments: dict[str, Any]
    # The authorizer's early view of the call's budgets (docs/budgets.md, "Budgets in Cedar
    # policies"); a budget not given here is seen as unused (the commit's own check decides).
    budgets: tuple[BudgetStanding, ...] = ()


def budgets_record(request: AuthorizationRequest, policies: PolicySet) -> dict[str, Any] | None:
    """``context.budgets`` of a request: each budget its action's schema declares, keyed by
    name; None when the schema declares none (an older schema)."""
    names = policies.budget_context.get(request.tool.name)
    if names is None:
        return None
    given = {s.name: s for s in request.budgets}
    # The tenant's budgets (its own replacing the default); a name the schema declares but
    # none of which applies to this tenant's call is shown uncapped.
    applying = {
        b.name: b.cap
        for b in budgets_of_tool(policies.budgets_for(request.actor.tenant), request.tool)
    }
    return {
        n: (
            given.get(n)
            or BudgetStanding(name=n, used=0, reserved=0, cap=applying.get(n, UNCAPPED))
        ).cedar()
        for n in names
    }


def _uid(kind: str, ident: str) -> dict[str, str]:
    # Structured, not Cedar's `Kind::"id"` text: nothing to escape, and Cedar builds the
    # request without running its parser on each uid (a third of a request's cost).
    return {"type": kind, "id": ident}


def _cedar_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cedar_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_cedar_value(v) for v in value]
    return value


def cedar_request(
    request: AuthorizationRequest, policies: PolicySet
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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
    cedar: dict[str, Any] = {
        "principal": _uid("User", principal_id),
        "action": _uid("Action", request.tool.name),
        "resource": resource_uid,
        "context": {
            "effect": request.tool.effect.value,
            "arguments": _cedar_value(request.arguments),
        },
    }
    budgets = budgets_record(request, policies)
    if budgets is not None:
        cedar["context"][BUDGETS_CONTEXT] = budgets
    return cedar, entities


# Cedar's entity-parsing errors quote the whole entity list (other calls' data in a batch):
# only the sentence after it is kept.
_ENTITY_LIST = re.compile(r"(?s)^failed to parse entities from:.*?\]: (?=[a-z])")
_POLICY_IN_ERROR = re.compile(r"error while evaluating policy `([^`]+)`")


def clean_error(error: str) -> str:
    """A Cedar diagnostic without the entity list it may quote, on one line, bounded."""
    return " ".join(_ENTITY_LIST.sub("", error).split())[:500]


def _decide(request: AuthorizationRequest, policies: PolicySet, result: Any) -> Decision:
    reasons = tuple(result.diagnostics.reasons)
    errors = tuple(clean_error(str(e)) for e in result.diagnostics.errors)
    if errors:
        # Fail closed: a policy that could not be evaluated might have been a forbid.
        named = tuple(dict.fromkeys(m for e in errors for m in _POLICY_IN_ERROR.findall(e)))
        cedar_ids = named or policies.policies_for(request.tool.name)
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.POLICY_DENIED,
            reasons=reasons,
            errors=errors,
            refusal=RefusalReason.EVALUATION_ERROR,
            policy_ids=tuple(policies.policy_id(c) for c in cedar_ids),
        )
    if not result.allowed:
        return Decision(
            verdict=Verdict.DENY,
            route=None,
            policy_version=policies.version,
            code=ErrorCode.POLICY_DENIED,
            reasons=reasons,
            refusal=RefusalReason.FORBID if reasons else RefusalReason.NO_PERMIT,
            # The forbid whose message the model reads first.
            policy_ids=tuple(policies.policy_id(r) for r in policies.ranked(reasons)),
            message=policies.message_of(reasons),
        )
    return Decision(
        verdict=Verdict.PERMIT,
        route=policies.route_for(request.tool.effect, reasons),
        policy_version=policies.version,
        reasons=reasons,
        policy_ids=tuple(policies.policy_id(r) for r in reasons),
    )


def _floats(value: Any, path: str) -> list[str]:
    if isinstance(value, float):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _floats(v, f"{path}.{k}")]
    if isinstance(value, list | tuple):
        return [p for v in value for p in _floats(v, f"{path}[]")]
    return []


def _undeclared(request: AuthorizationRequest) -> list[str]:
    """What the loaded resource has that its tool's `ResourceFacts` does not declare (or
    lacks that it does): named here, since Cedar's own words do not name the tool."""
    facts, resource = request.tool.resource, request.resource
    if facts is None or resource is None:
        return []
    tool = request.tool.name
    problems = []
    if resource.kind != facts.kind:
        problems.append(
            f"tool {tool}: the loader returned kind {resource.kind!r}, not {facts.kind!r}"
        )
    declared = facts.model_fields
    problems += [
        f"tool {tool}: the loader returned attribute {name!r}, "
        f"which {facts.__name__} does not declare"
        for name in sorted(set(resource.attributes) - set(declared))
    ]
    problems += [
        f"tool {tool}: the loader did not return attribute {name!r}, declared by {facts.__name__}"
        for name, field_info in declared.items()
        if field_info.is_required() and name not in resource.attributes
    ]
    return problems


def _unrepresentable(request: AuthorizationRequest, policies: PolicySet) -> Decision | None:
    """Cedar has no floating-point numbers (its own error for one says nothing useful), and
    its entity errors do not name the tool: a float among the loaded attributes or the
    arguments, or an attribute the tool's `ResourceFacts` does not declare, is an evaluation
    error named here."""
    where = []
    if request.resource is not None:
        where += _floats(request.resource.attributes, entity_type(request.resource.kind))
    where += _floats(request.arguments, "context.arguments")
    errors = [
        f"attribute `{w}` of tool {request.tool.name} is a float; Cedar has no floats "
        "(use an integer, e.g. money in minor units)"
        for w in where
    ] + _undeclared(request)
    if not errors:
        return None
    return Decision(
        verdict=Verdict.DENY,
        route=None,
        policy_version=policies.version,
        code=ErrorCode.POLICY_DENIED,
        errors=tuple(errors),
        refusal=RefusalReason.EVALUATION_ERROR,
        policy_ids=tuple(policies.policy_id(c) for c in policies.policies_for(request.tool.name)),
    )


def _report(request: AuthorizationRequest, decision: Decision) -> None:
    """Evaluation errors are never silent: logged with Cedar's words and counted per policy
    (the outcome, which the audit log records, names the policies and the reason)."""
    if decision.refusal is not RefusalReason.EVALUATION_ERROR:
        return
    for policy_id in decision.policy_ids or ("-",):
        count_policy_evaluation_error(policy_id)
    log.error(
        "policy evaluation error, call denied: tool=%s tenant=%s policies=%s version=%s: %s",
        request.tool.name,
        request.actor.tenant,
        ",".join(decision.policy_ids) or "-",
        decision.policy_version,
        " | ".join(decision.errors),
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
    decisions: list[Decision | None] = [
        _foreign(r, policies) or _unrepresentable(r, policies) for r in requests
    ]
    for request, early in zip(requests, decisions, strict=True):
        if early is not None:
            _report(request, early)
    undecided = [i for i, d in enumerate(decisions) if d is None]
    for group in _consistent_groups(undecided, requests, policies):
        indexes = [i for i, _ in group]
        entities: dict[tuple[str, str], dict[str, Any]] = {}
        for _, (_, request_entities) in group:
            entities.update({(e["uid"]["type"], e["uid"]["id"]): e for e in request_entities})
        # Identical requests of a group (same principal, action, resource and context; its
        # entities agree by construction) have one answer: Cedar decides each once.
        calls: list[CedarCall] = []  # the distinct requests, first of each
        slots: list[int] = []  # each member's place in ``calls``
        distinct: dict[str, int] = {}
        for _, call in group:
            slot = distinct.setdefault(_request_key(call[0]), len(calls))
            if slot == len(calls):
                calls.append(call)
            slots.append(slot)
        unique = _answered(calls, list(distinct), list(entities.values()), policies)
        results = [unique[slot] for slot in slots]
        for i, result in zip(indexes, results, strict=True):
            decision = decisions[i] = _decide(requests[i], policies, result)
            _report(requests[i], decision)
    return [d for d in decisions if d is not None]


# Answers kept per policy set (PolicySet.answers): past this many, the oldest half goes.
# Each is a 20-byte digest of the question and Cedar's answer: a few MB at most.
ANSWERS_KEPT = 4096


def _answered(
    calls: list[CedarCall], keys: list[str], entities: list[dict[str, Any]], policies: PolicySet
) -> list[Any]:
    """Cedar's answer to each of ``calls`` (distinct requests, ``keys`` their texts) on the
    group's ``entities``: those asked before with the same entities from the set's answers,
    the others in one evaluation (each on its own when Cedar refuses an entity of the batch,
    so that one bad resource never decides the others); answers without errors are kept."""
    kept = policies.answers
    found: list[Any] = [None] * len(calls)
    wanted = [
        hashlib.blake2b(f"{key}\0{call[1]!r}".encode(), digest_size=20).digest()
        for key, call in zip(keys, calls, strict=True)
    ]
    missing = []
    for n, key in enumerate(wanted):
        answer = kept.get(key)
        if answer is None:
            missing.append(n)
        else:
            found[n] = answer
    if not missing:
        return found
    asked = [calls[n] for n in missing]
    answers = _evaluate([cedar for cedar, _ in asked], entities, policies)
    if len(asked) > 1 and any(r.diagnostics.errors for r in answers):
        answers = [_evaluate([cedar], ents, policies)[0] for cedar, ents in asked]
    if len(kept) + len(missing) > ANSWERS_KEPT:
        for old in list(kept)[: len(kept) // 2]:
            del kept[old]
    for n, answer in zip(missing, answers, strict=True):
        found[n] = answer
        if not answer.diagnostics.errors:
            kept[wanted[n]] = answer
    return found


def _evaluate(
    cedar: list[dict[str, Any]], entities: list[dict[str, Any]], policies: PolicySet
) -> list[Any]:
    return list(
        cedarpy.is_authorized_batch(cedar, policies.parsed, entities, policies.parsed_schema)
    )


CedarCall = tuple[dict[str, Any], list[dict[str, Any]]]


def _request_key(cedar: dict[str, Any]) -> str:
    """A Cedar request as text: equal texts are the same question. `repr` of the plain
    JSON values a request holds is unambiguous and a third of `json.dumps`' cost; two equal
    requests built in another key order only miss the reuse."""
    return repr(cedar)


def _consistent_groups(
    indexes: list[int], requests: Sequence[AuthorizationRequest], policies: PolicySet
) -> list[list[tuple[int, CedarCall]]]:
    """Split into batches whose entities agree: one batch shares one entity list, so two
    requests naming the same entity with different attributes (the same user with other
    roles, a payment re-read after a change) must not share a batch."""
    groups: list[list[tuple[int, CedarCall]]] = []
    seen: list[dict[tuple[str, str], dict[str, Any]]] = []
    for i in indexes:
        call = cedar_request(requests[i], policies)
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


# -- checking a policy directory (`ratifier policy check`) ------------------------------------


@dataclass(frozen=True, kw_only=True)
class PolicyProblem:
    """One thing wrong with a policy set, where it is: ``file:line: message``."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class Statement:
    text: str
    line: int  # where the statement starts (its first annotation or keyword)


def statements(text: str) -> list[Statement]:
    """Split Cedar source into its policies (top-level ``;``), skipping comments and strings,
    so that each can be parsed and validated on its own and reported with its line."""
    found: list[Statement] = []
    start: int | None = None
    i, n, line, start_line = 0, len(text), 1, 1
    while i < n:
        char = text[i]
        if char == "\n":
            line += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
            continue
        elif char == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n":
                    line += 1
                i += 1
        elif char == ";" and start is not None:
            found.append(Statement(text=text[start : i + 1], line=start_line))
            start = None
        elif not char.isspace() and start is None:
            start, start_line = i, line
        i += 1
    if start is not None and text[start:].strip():
        found.append(Statement(text=text[start:], line=start_line))
    return found


def _cedar_message(exc: Exception | str) -> str:
    return " ".join(re.sub(r"^(\[policy\d+\] )?(for policy `policy\d+`, )?", "", str(exc)).split())


def directory_budgets(directory: Path) -> tuple[Budget, ...]:
    """The budgets of a policy directory for its generated schema. A budgets file that does
    not load raises `ConfigurationError` naming the bad budget: a schema generated without
    its budgets would only move the error to the policies that name them."""
    return load_budget_file(directory)


def _without_budgets(schema: Any) -> Any:
    """``schema`` (JSON form) with every action's ``context.budgets`` taken out."""
    if not isinstance(schema, dict):
        return schema
    stripped = json.loads(json.dumps(schema))
    for namespace in stripped.values():
        actions = namespace.get("actions", {}) if isinstance(namespace, dict) else {}
        for spec in actions.values():
            context = (spec.get("appliesTo") or {}).get("context") or {}
            (context.get("attributes") or {}).pop(BUDGETS_CONTEXT, None)
    return stripped


def _with_budgets_of(generated: dict[str, Any], on_disk: Any) -> dict[str, Any]:
    """``generated`` with each action's ``context.budgets`` as ``on_disk`` declares it: the
    schema to check policies against while the budgets file does not load, so that its own
    problem is the one reported, not the drift it would cause."""
    grafted: dict[str, Any] = json.loads(json.dumps(generated))
    if not isinstance(on_disk, dict):
        return grafted
    for name, namespace in grafted.items():
        theirs = on_disk.get(name)
        their_actions = theirs.get("actions", {}) if isinstance(theirs, dict) else {}
        for action, spec in namespace.get("actions", {}).items():
            their_spec = their_actions.get(action)
            if not isinstance(their_spec, dict):
                continue
            their_context = (their_spec.get("appliesTo") or {}).get("context") or {}
            declared = (their_context.get("attributes") or {}).get(BUDGETS_CONTEXT)
            if declared is not None:
                spec["appliesTo"]["context"]["attributes"][BUDGETS_CONTEXT] = declared
    return grafted


def check_policy_directory(directory: Path, catalog: Catalog) -> list[PolicyProblem]:
    """Everything wrong with the policy set in ``directory`` for ``catalog``: the budgets
    file's problems first (each bad budget by name, file and line), the catalog's
    declarations the Cedar schema cannot express (file and line of the declaration), a
    schema file that differs from the generated one, and each policy that does not parse or
    does not match the generated schema (file, and the line of the problem in the policy).

    While the budgets file does not load, ``context.budgets`` is taken as the schema file
    declares it: its drift and the policies naming those budgets are knock-ons of the bad
    budget, not reported."""
    budget_file = read_budget_file(directory)
    problems = _budget_problems(budget_file, catalog)
    generated = generate_schema(catalog, budget_file.budgets)
    for p in generated.problems:
        source_file, _, source_line = p.source.rpartition(":")
        problems.append(
            PolicyProblem(
                file=source_file or "<catalog>",
                line=int(source_line) if source_line.isdigit() else 0,
                message=f"tool {p.tool}: {p.where}: {p.problem}",
            )
        )
    expected = generated.schema
    for schema_file in sorted(directory.glob(f"*{SCHEMA_SUFFIX}")):
        try:
            on_disk = json.loads(schema_file.read_text(encoding="utf-8"))
        except ValueError as exc:
            problems.append(
                PolicyProblem(file=str(schema_file), line=1, message=f"not JSON: {exc}")
            )
            continue
        if budget_file.problems:
            expected = _with_budgets_of(generated.schema, on_disk)
            differs = _without_budgets(on_disk) != _without_budgets(generated.schema)
        else:
            differs = on_disk != generated.schema
        if differs:
            problems.append(
                PolicyProblem(
                    file=str(schema_file),
                    line=1,
                    message=(
                        "differs from the schema generated from the catalog "
                        "(regenerate it: ratifier policy schema > " + schema_file.name + ")"
                    ),
                )
            )
    schema = cedarpy.Schema.from_json_str(json.dumps(expected))
    policy_files = sorted(directory.glob("*.cedar"))
    if not policy_files:
        problems.append(PolicyProblem(file=str(directory), line=0, message="no *.cedar files"))
    return problems + check_policy_files(policy_files, schema)


AnnotationCheck = Callable[[dict[str, str]], list[str]]


def check_policy_files(
    policy_files: Sequence[Path],
    schema: Any,
    *,
    annotations: AnnotationCheck = annotation_problems,
) -> list[PolicyProblem]:
    """Each policy of ``policy_files`` that does not parse, does not match ``schema`` (a
    parsed `cedarpy.Schema`), has bad annotations or repeats an ``@id``: at the line of the
    problem itself where Cedar's message lets it be found, else of the policy's start."""
    problems: list[PolicyProblem] = []
    ids: dict[str, str] = {}
    for policy_file in policy_files:
        for statement in statements(policy_file.read_text(encoding="utf-8")):
            file, line = str(policy_file), statement.line
            try:
                parsed = json.loads(cedarpy.policies_to_json_str(statement.text))
            except ValueError as exc:  # cedarpy raises bare ValueErrors
                problems.append(
                    PolicyProblem(
                        file=file,
                        line=line + parse_error_line(statement.text, str(exc)),
                        message=f"does not parse: {exc}",
                    )
                )
                continue
            for policy in parsed.get("staticPolicies", {}).values():
                found = dict(policy.get("annotations") or {})
                problems += [
                    PolicyProblem(
                        file=file,
                        line=line + _annotation_line(statement.text, problem),
                        message=problem,
                    )
                    for problem in annotations(found)
                ]
                policy_id = found.get(ID_ANNOTATION)
                if policy_id and policy_id in ids:
                    problems.append(
                        PolicyProblem(
                            file=file,
                            line=line,
                            message=f"@id {policy_id!r} also at {ids[policy_id]}",
                        )
                    )
                elif policy_id:
                    ids[policy_id] = f"{policy_file}:{statement.line}"
            result = cedarpy.validate_policies(statement.text, schema)
            for error in result.errors:
                message = _cedar_message(error.error)
                problems.append(
                    PolicyProblem(
                        file=file, line=line + quoted_line(statement.text, message), message=message
                    )
                )
    return problems


def _budget_problems(budget_file: BudgetFile, catalog: Catalog) -> list[PolicyProblem]:
    """The budgets file's problems (each bad budget by name, at its line when known), and
    each budget naming a tool the catalog does not have (docs/budgets.md)."""
    file = str(budget_file.path)
    return [
        PolicyProblem(file=p.source, line=p.line, message=p.message) for p in budget_file.problems
    ] + [
        PolicyProblem(
            file=file,
            line=0,
            message=f"budget {b.name}"
            + (f" (tenant {b.tenant})" if b.tenant else "")
            + f": no tool {tool!r} in the catalog",
        )
        for b in budget_file.budgets
        for tool in b.tools
        if catalog.get(tool) is None
    ]


# -- where in a policy a problem is (cedarpy's errors carry no source positions) -------------

_END_OF_INPUT = "unexpected end of input"
_QUOTED = re.compile(r"`([^`]+)`")
_GENERATED_ID = re.compile(r"^policy\d+$")


def parse_error_line(text: str, error: str) -> int:
    """The line (0 for the policy's first) of a syntax error in one policy: the first line
    whose prefix of the policy fails otherwise than by ending early. An error Cedar finds
    only in the whole policy (an invalid member access, say) is looked up by the text it
    quotes."""
    lines = text.split("\n")
    for index in range(len(lines) - 1):
        try:
            cedarpy.policies_to_json_str("\n".join(lines[: index + 1]))
        except ValueError as exc:
            if _END_OF_INPUT not in str(exc):
                return index
    return quoted_line(text, error)


def _code_only(text: str) -> str:
    """``text`` with comments and the contents of string literals blanked (lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(" " * (end - i))
            i = end
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            literal = text[i : j + 1]
            out.append('"' + "".join(c if c == "\n" else " " for c in literal[1:-1]) + '"')
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)[:n]


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), text)


def quoted_line(text: str, message: str) -> int:
    """The line (0 for the policy's first) of the first text quoted in Cedar's ``message``
    (`` `refundable` ``, `` `Action::"x"` ``) that the policy's code holds: an identifier as
    a whole word outside strings and comments, anything else verbatim outside comments.
    0 when none is found."""
    code, plain = _code_only(text), _without_comments(text)
    for quoted in _QUOTED.findall(message):
        if _GENERATED_ID.match(quoted):
            continue
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", quoted):
            word = re.search(rf"(?<![A-Za-z0-9_]){re.escape(quoted)}(?![A-Za-z0-9_])", code)
            at = word.start() if word else -1
        else:
            at = plain.find(quoted)
        if at >= 0:
            return text.count("\n", 0, at)
    return 0


def _annotation_line(text: str, problem: str) -> int:
    name = re.match(r"@(\w+)", problem)
    if name:
        at = _without_comments(text).find(f"@{name.group(1)}")
        if at >= 0:
            return text.count("\n", 0, at)
    return 0


def catalog_mismatches(policies: PolicySet, catalog: Catalog) -> list[str]:
    """Loader attributes the policy set's schema does not declare, or declares otherwise: such
    a set would deny every call of the tool with an evaluation error, so start-up refuses it.
    Names the tool and the attribute."""
    generated = generate_schema(catalog).schema[""]["entityTypes"]
    declared = json.loads(policies.schema).get("", {}).get("entityTypes", {})
    problems = []
    for tool in sorted(catalog, key=lambda t: t.name):
        if tool.resource is None:
            continue
        kind = entity_type(tool.resource.kind)
        ours = generated.get(kind, {}).get("shape", {}).get("attributes", {})
        theirs = declared.get(kind, {}).get("shape", {}).get("attributes")
        if theirs is None:
            problems.append(f"tool {tool.name}: the Cedar schema has no entity type {kind}")
            continue
        for name, cedar in ours.items():
            if name not in theirs:
                problems.append(
                    f"tool {tool.name}: loader attribute {name!r} is not declared on {kind} "
                    "in the Cedar schema"
                )
            elif theirs[name] != cedar:
                problems.append(
                    f"tool {tool.name}: loader attribute {name!r} is {cedar} but the Cedar "
                    f"schema declares {theirs[name]}"
                )
        problems += [
            f"tool {tool.name}: the Cedar schema declares {kind}.{name}, which the loader "
            "does not return"
            for name, cedar in theirs.items()
            if name not in ours and cedar.get("required", True)
        ]
    return problems
