"""`@approval("auto")`: which policy approved a call whose effect would need a human."""

from __future__ import annotations

from commands.catalog import Resource, Tool
from commands.policy import APPROVAL_ANNOTATION, APPROVAL_EFFECTS, Decision, PolicySet
from schemas.envelopes import Effect, Route

# The fallback for a tool whose `ResourceFacts` declares no ``owner_attribute`` (or that
# declares no facts): attributes that name whom a resource belongs to, in this order.
FALLBACK_OWNER_ATTRIBUTES = ("owner", "customer_id", "customer_email")


def owner_attributes(tool: Tool | None) -> tuple[str, ...]:
    """Where the owner of ``tool``'s resource is found: the attribute its `ResourceFacts`
    declares as ``owner_attribute``, else the fallback names."""
    declared = tool.resource.owner_attribute if tool is not None and tool.resource else None
    return (declared,) if declared else FALLBACK_OWNER_ATTRIBUTES


def resource_owner(resource: Resource | None, tool: Tool | None = None) -> str | None:
    """Whom the loaded resource belongs to (the subject who may confirm a call on it)."""
    if resource is None:
        return None
    for name in owner_attributes(tool):
        value = resource.attributes.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def auto_approving_policy(policies: PolicySet, effect: Effect, decision: Decision) -> str | None:
    """The id of the permitting policy annotated `@approval("auto")` that sent an
    approval-needing effect to auto-commit; None when no approval was needed or waived."""
    if decision.route is not Route.AUTO or effect not in APPROVAL_EFFECTS:
        return None
    for reason in decision.reasons:
        annotations = policies.annotations.get(reason, {})
        if annotations.get(APPROVAL_ANNOTATION) == "auto":
            return annotations.get("id", reason)
    return None
