"""Approver rights as Cedar policy (`approvals/policies/approvers.cedar` by default, or the
directory ``RATIFIER_APPROVALS__APPROVER_POLICY_DIR``). Pure: a decision is one Cedar evaluation.

Principal ``Approver`` (sub, tenant, roles), action ``approve`` / ``reject`` / ``edit``,
resource ``PendingCall`` (tool, effect, tenant, requester, owner, amount_minor,
self_approval_allowed), context ``kind`` (``approver`` or ``confirmation``). Action ``open``
is asked once per request: annotations ``@ttl_seconds`` and ``@approvers`` of the permitting
policies set its TTL and how many distinct approvers it needs. A ``forbid`` may name the
refusal it stands for with ``@refusal("self_approval")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import cedarpy

from approvals.rights import PendingCall
from approvals.signing import DecisionRefusal
from commands.policy import PolicySet
from schemas.envelopes import DecisionKind, DecisionStatement
from schemas.errors import ConfigurationError
from schemas.settings import Settings

DEFAULT_APPROVER_POLICY_DIR = Path(__file__).parent / "policies"
SCHEMA_FILE = "approvers.cedarschema.json"
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
class PolicyRights:
    """`approvals.rights.ApproverRights` decided by a Cedar policy set."""

    policies: PolicySet

    @classmethod
    def from_directory(cls, directory: Path = DEFAULT_APPROVER_POLICY_DIR) -> PolicyRights:
        texts = sorted(directory.glob("*.cedar"))
        schema = directory / SCHEMA_FILE
        if not texts or not schema.is_file():
            raise ConfigurationError(
                f"{directory} needs *.cedar approver policies and {SCHEMA_FILE}"
            )
        text = "\n".join(p.read_text(encoding="utf-8") for p in texts)
        return cls(policies=PolicySet.from_sources(text, schema.read_text(encoding="utf-8")))

    @classmethod
    def for_settings(cls, settings: Settings) -> PolicyRights:
        directory = settings.approvals.approver_policy_dir
        return cls.from_directory(Path(directory) if directory else DEFAULT_APPROVER_POLICY_DIR)

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

    def _open(self, pending: PendingCall) -> dict[str, list[str]]:
        allowed, reasons = self._ask(
            "open",
            sub=_NOBODY,
            tenant=pending.call.tenant,
            roles=(),
            kind=DecisionKind.APPROVER.value,
            pending=pending,
        )
        found: dict[str, list[str]] = {}
        for reason in reasons if allowed else ():
            for name, value in self.policies.annotations.get(reason, {}).items():
                found.setdefault(name, []).append(value)
        return found

    def required_approvals(self, pending: PendingCall) -> int:
        values = [int(v) for v in self._open(pending).get("approvers", []) if v.isdigit()]
        return max([1, *values])

    def ttl(self, pending: PendingCall) -> timedelta | None:
        values = [int(v) for v in self._open(pending).get("ttl_seconds", []) if v.isdigit()]
        if values:
            return timedelta(seconds=min(values))
        return pending.tool.approval_ttl if pending.tool is not None else None
