"""Who may throw the kill switch: operator rights as Cedar policy
(`approvals/operator_policies/operators.cedar`). Pure: one Cedar evaluation per question.

Principal ``Operator`` (sub, tenant, roles: from the verified token, as an approver's),
action ``freeze`` / ``unfreeze``, resource ``Scope`` (kind, tenant; ``*`` for `writes:*`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import cedarpy

from commands.freezes import EVERY_TENANT, Scope, freeze_record
from config.settings import Settings
from feeds.freezes import publish_freeze
from runtime.identity import ContextKeys, verify_context_token
from schemas.envelopes import Actor, FreezeRecord
from schemas.errors import ConfigurationError, PolicyDenied, Unauthenticated

OPERATOR_POLICY_DIR = Path(__file__).parent / "operator_policies"
SCHEMA_FILE = "operators.cedarschema.json"


@dataclass(frozen=True, kw_only=True)
class OperatorRights:
    """The operator policies, parsed and checked against their schema once. Cedar directly,
    not the catalog's `commands.policy.PolicySet` (budgets, limits, annotations, metrics):
    `ratifier freeze` loads only what a rights check needs, so it starts fast."""

    parsed: Any
    parsed_schema: Any

    @classmethod
    def from_directory(cls, directory: Path = OPERATOR_POLICY_DIR) -> OperatorRights:
        text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.cedar")))
        schema = (directory / SCHEMA_FILE).read_text(encoding="utf-8")
        try:
            parsed = cedarpy.PolicySet.from_str(text)
            parsed_schema = cedarpy.Schema.from_json_str(schema)
            result = cedarpy.validate_policies(text, parsed_schema)
        except Exception as exc:  # cedarpy raises bare ValueErrors with Cedar's words
            raise ConfigurationError(f"operator policies do not parse: {exc}") from exc
        if not result.validation_passed:
            problems = "; ".join(str(e) for e in result.errors)
            raise ConfigurationError(f"operator policies do not match their schema: {problems}")
        return cls(parsed=parsed, parsed_schema=parsed_schema)

    def allows(self, operator: Actor, *, frozen: bool, scope: Scope) -> bool:
        """Whether ``operator`` may freeze (``frozen``) or unfreeze ``scope``."""
        return self._allows(operator, "freeze" if frozen else "unfreeze", scope)

    def may_resolve(self, operator: Actor, tenant: str) -> bool:
        """Whether ``operator`` may settle an unknown operation of ``tenant`` by hand."""
        return self._allows(operator, "resolve", Scope.parse(f"tenant:{tenant}"))

    def _allows(self, operator: Actor, action: str, scope: Scope) -> bool:
        request = {
            "principal": {"type": "Operator", "id": f"{operator.tenant}/{operator.sub}"},
            "action": {"type": "Action", "id": action},
            "resource": {"type": "Scope", "id": scope.key},
            "context": {},
        }
        entities: list[dict[str, Any]] = [
            {
                "uid": {"type": "Operator", "id": f"{operator.tenant}/{operator.sub}"},
                "attrs": {
                    "sub": operator.sub,
                    "tenant": operator.tenant,
                    "roles": list(operator.roles),
                },
                "parents": [],
            },
            {
                "uid": {"type": "Scope", "id": scope.key},
                "attrs": {"kind": scope.kind.value, "tenant": scope.tenant},
                "parents": [],
            },
        ]
        (result,) = cedarpy.is_authorized_batch(
            [request], self.parsed, entities, self.parsed_schema
        )
        return bool(result.allowed)


def operator_from(token: str | None, keys: ContextKeys) -> Actor:
    """The operator named by ``token`` (verified like an approver's; rights are per scope)."""
    if not token:
        raise Unauthenticated()
    return verify_context_token(token, keys)


def check_operator(rights: OperatorRights, operator: Actor, *, frozen: bool, scope: Scope) -> None:
    """`PolicyDenied` unless ``operator`` may (un)freeze ``scope``."""
    if not rights.allows(operator, frozen=frozen, scope=scope):
        raise PolicyDenied("This token may not freeze or unfreeze that scope.")


def check_resolver(rights: OperatorRights, operator: Actor, tenant: str) -> None:
    """`PolicyDenied` unless ``operator`` may settle ``tenant``'s unknown operations."""
    if not rights.may_resolve(operator, tenant):
        raise PolicyDenied("This token may not resolve that tenant's operations.")


@dataclass(frozen=True, kw_only=True)
class SwitchThrown:
    """A published freeze (or unfreeze) and when the broker acknowledged it: from then on,
    every stage refuses what it stops (docs/kill-switch.md)."""

    record: FreezeRecord
    acknowledged_at: datetime


async def throw_switch(
    settings: Settings,
    rights: OperatorRights,
    operator: Actor,
    *,
    scope_text: str,
    frozen: bool,
    reason: str,
) -> SwitchThrown:
    """Freeze (or unfreeze) a scope for ``operator`` after the rights check; returns once the
    broker acknowledged the record (from then on every stage stops it within 1 s)."""
    scope = Scope.parse(scope_text)
    check_operator(rights, operator, frozen=frozen, scope=scope)
    record = freeze_record(
        scope, frozen=frozen, by=operator.sub, by_tenant=operator.tenant, reason=reason
    )
    acknowledged_at = await publish_freeze(settings, record)
    return SwitchThrown(record=record, acknowledged_at=acknowledged_at)


def visible_to(operator: Actor, records: list[FreezeRecord]) -> list[FreezeRecord]:
    """The freezes an operator sees: their tenant's scopes and the fleet-wide ones."""
    return [r for r in records if Scope.parse(r.scope).tenant in (operator.tenant, EVERY_TENANT)]
