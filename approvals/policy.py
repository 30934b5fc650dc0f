"""Approver rights as Cedar policy. Pure: a decision is one Cedar evaluation.

The set in force is ratifier's reference set (`approvals/policies/approvers.cedar`) plus the
catalog's own approver policies (``Catalog(approver_policies=...)``), or the catalog's alone
when it sets ``reference_approver_policies=False``; a deployment's
``RATIFIER_APPROVALS__APPROVER_POLICY_DIR`` replaces both. All are checked against one schema,
ratifier's ``approvers.cedarschema.json`` (`ratifier policy schema --approvers`).

Principal ``Approver`` (sub, tenant, roles), action ``approve`` / ``reject`` / ``edit``,
resource ``PendingCall`` (tool, effect, tenant, requester, owner, amount_minor,
self_approval_allowed), context ``kind`` (``approver`` or ``confirmation``). Action ``open``
is asked when a request opens (kind ``approver``) and when its owner confirms (kind
``confirmation``): annotations ``@ttl_seconds`` and ``@approvers`` of the permitting policies
set its TTL and how many distinct approvers (or confirmations) it needs. A ``forbid`` may name
the refusal it stands for with ``@refusal("self_approval")``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import cedarpy

from approvals.rights import PendingCall
from approvals.signing import DecisionRefusal
from commands.catalog import Catalog
from commands.policy import SCHEMA_SUFFIX, PolicyProblem, PolicySet, check_policy_files
from config.settings import Settings
from schemas.envelopes import DecisionKind, DecisionStatement
from schemas.errors import ConfigurationError

DEFAULT_APPROVER_POLICY_DIR = Path(__file__).parent / "policies"
SCHEMA_FILE = "approvers.cedarschema.json"
# The one approver schema: what `_entities` builds (a folder may hold a copy, checked equal).
APPROVER_SCHEMA = DEFAULT_APPROVER_POLICY_DIR / SCHEMA_FILE
# The Cedar approver for action "open" (nobody decides yet; only the call's attributes count).
_NOBODY = "ratifier:open"


def _amount(arguments: dict[str, Any]) -> int:
    value = arguments.get("amount_minor")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _entities(sub: str, tenant: str, roles: tuple[str, ...], pending: PendingCall) -> list[Any]:
    call = pending.call
    return [
        {
            "uid": {"type": "Approver", "id": f"{tenant}/{sub}"},
            "attrs": {"sub": sub, "tenant": tenant, "roles": list(roles)},
            "parents": [],
        },
        {
            "uid": {"type": "PendingCall", "id": call.call_id},
            "attrs": {
                "tool": call.tool,
                "effect": call.effect.value,
                "tenant": call.tenant,
                "requester": call.actor.sub,
                "owner": call.resource_owner or "",
                "amount_minor": _amount(call.arguments),
                "self_approval_allowed": bool(
                    pending.tool is not None and pending.tool.allow_self_approval
                ),
            },
            "parents": [],
        },
    ]


@dataclass(frozen=True, kw_only=True)
class ApproverPolicySources:
    """Where the approver policies in force come from: the ``*.cedar`` files of
    ``directories`` (in this order; files by name within each) and one schema file."""

    directories: tuple[Path, ...]
    schema: Path

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(f for d in self.directories for f in sorted(d.glob("*.cedar")))

    def __str__(self) -> str:
        return ", ".join(
            "reference set" if d == DEFAULT_APPROVER_POLICY_DIR else str(d)
            for d in self.directories
        )


def approver_policy_sources(
    catalog: Catalog | None, directory: Path | str | None = None
) -> ApproverPolicySources:
    """The approver policies for ``catalog``: a deployment's ``directory``
    (``RATIFIER_APPROVALS__APPROVER_POLICY_DIR``, with its own schema file) alone; else the
    reference set and the catalog's folder, or the catalog's folder alone when it replaces
    the reference set."""
    if directory:
        return ApproverPolicySources(
            directories=(Path(directory),), schema=Path(directory) / SCHEMA_FILE
        )
    directories: tuple[Path, ...] = ()
    if catalog is None or catalog.reference_approver_policies:
        directories += (DEFAULT_APPROVER_POLICY_DIR,)
    if catalog is not None and catalog.approver_policies is not None:
        directories += (Path(catalog.approver_policies),)
    return ApproverPolicySources(directories=directories, schema=APPROVER_SCHEMA)


def approver_annotation_problems(annotations: dict[str, str]) -> list[str]:
    """What is wrong with an approver policy's annotations (`ratifier policy check`)."""
    problems = [
        f"@{name}({value!r}) is not a positive integer"
        for name in ("approvers", "ttl_seconds")
        if (value := annotations.get(name)) is not None and not (value.isdigit() and int(value) > 0)
    ]
    refusal = annotations.get("refusal")
    if refusal is not None and refusal not in {r.value for r in DecisionRefusal}:
        problems.append(f"@refusal({refusal!r}) is not a decision refusal")
    return problems


def check_approver_policies(sources: ApproverPolicySources) -> list[PolicyProblem]:
    """Everything wrong with the approver policies in force (`ratifier policy check`): a
    folder without policies, a schema file that differs from ratifier's approver schema,
    and each policy that does not parse, does not match the schema, has bad annotations or
    repeats an ``@id`` of another folder, at its file and line."""
    problems: list[PolicyProblem] = []
    ours = json.loads(APPROVER_SCHEMA.read_text(encoding="utf-8"))
    for directory in sources.directories:
        if not sorted(directory.glob("*.cedar")):
            problems.append(
                PolicyProblem(file=str(directory), line=0, message="no *.cedar approver policies")
            )
        for schema_file in sorted(directory.glob(f"*{SCHEMA_SUFFIX}")):
            try:
                same = json.loads(schema_file.read_text(encoding="utf-8")) == ours
            except ValueError as exc:
                problems.append(
                    PolicyProblem(file=str(schema_file), line=1, message=f"not JSON: {exc}")
                )
                continue
            if not same:
                problems.append(
                    PolicyProblem(
                        file=str(schema_file),
                        line=1,
                        message="differs from ratifier's approver schema (regenerate it: "
                        f"ratifier policy schema --approvers > {schema_file.name})",
                    )
                )
    schema = cedarpy.Schema.from_json_str(APPROVER_SCHEMA.read_text(encoding="utf-8"))
    return problems + check_policy_files(
        sources.files, schema, annotations=approver_annotation_problems
    )


@dataclass(frozen=True, kw_only=True)
class PolicyRights:
    """`approvals.rights.ApproverRights` decided by a Cedar policy set."""

    policies: PolicySet

    @classmethod
    def from_directory(cls, directory: Path = DEFAULT_APPROVER_POLICY_DIR) -> PolicyRights:
        return cls.from_sources(approver_policy_sources(None, directory))

    @classmethod
    def from_sources(cls, sources: ApproverPolicySources) -> PolicyRights:
        empty = [d for d in sources.directories if not sorted(d.glob("*.cedar"))]
        if not sources.directories or empty or not sources.schema.is_file():
            raise ConfigurationError(
                f"approver policies need *.cedar files in {sources} and the schema {sources.schema}"
            )
        return cls(policies=_policy_set(sources.files, sources.schema))

    @classmethod
    def for_catalog(cls, catalog: Catalog, directory: Path | str | None = None) -> PolicyRights:
        return cls.from_sources(approver_policy_sources(catalog, directory))

    @classmethod
    def for_settings(cls, settings: Settings, catalog: Catalog | None = None) -> PolicyRights:
        return cls.from_sources(
            approver_policy_sources(catalog, settings.approvals.approver_policy_dir)
        )

    def _ask(
        self,
        action: str,
        *,
        sub: str,
        tenant: str,
        roles: tuple[str, ...],
        kind: str,
        pending: PendingCall,
    ) -> tuple[bool, tuple[str, ...]]:
        request = {
            # Structured uids: nothing to escape (as in commands/policy.py).
            "principal": {"type": "Approver", "id": f"{tenant}/{sub}"},
            "action": {"type": "Action", "id": action},
            "resource": {"type": "PendingCall", "id": pending.call.call_id},
            "context": {"kind": kind},
        }
        (result,) = cedarpy.is_authorized_batch(
            [request],
            self.policies.parsed,
            _entities(sub, tenant, roles, pending),
            self.policies.parsed_schema,
        )
        return bool(result.allowed), tuple(result.diagnostics.reasons)

    def refusal(self, statement: DecisionStatement, pending: PendingCall) -> DecisionRefusal | None:
        approver = statement.approver
        allowed, reasons = self._ask(
            statement.decision.value,
            sub=approver.sub,
            tenant=approver.tenant,
            roles=approver.roles,
            kind=statement.kind.value,
            pending=pending,
        )
        if allowed:
            return None
        for reason in reasons:
            named = self.policies.annotations.get(reason, {}).get("refusal")
            if isinstance(named, str) and named in {r.value for r in DecisionRefusal}:
                return DecisionRefusal(named)
        return DecisionRefusal.APPROVER_NOT_PERMITTED

    def _open(
        self, pending: PendingCall, kind: DecisionKind = DecisionKind.APPROVER
    ) -> dict[str, list[str]]:
        allowed, reasons = self._ask(
            "open",
            sub=_NOBODY,
            tenant=pending.call.tenant,
            roles=(),
            kind=kind.value,
            pending=pending,
        )
        found: dict[str, list[str]] = {}
        for reason in reasons if allowed else ():
            for name, value in self.policies.annotations.get(reason, {}).items():
                found.setdefault(name, []).append(value)
        return found

    def required_approvals(
        self, pending: PendingCall, kind: DecisionKind = DecisionKind.APPROVER
    ) -> int:
        values = [int(v) for v in self._open(pending, kind).get("approvers", []) if v.isdigit()]
        return max([1, *values])

    def awaits_confirmation(self, pending: PendingCall) -> bool:
        """Whether the resource's owner may confirm the call (it then waits for them)."""
        if not pending.owner:
            return False
        allowed, _ = self._ask(
            "approve",
            sub=pending.owner,
            tenant=pending.call.tenant,
            roles=(),
            kind=DecisionKind.CONFIRMATION.value,
            pending=pending,
        )
        return allowed

    def ttl(self, pending: PendingCall) -> timedelta | None:
        values = [int(v) for v in self._open(pending).get("ttl_seconds", []) if v.isdigit()]
        if values:
            return timedelta(seconds=min(values))
        return pending.tool.approval_ttl if pending.tool is not None else None


def _policy_set(files: Sequence[Path], schema: Path) -> PolicySet:
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    return PolicySet.from_sources(text, schema.read_text(encoding="utf-8"))
