"""Approver rights as Cedar policy: the reference set in approvals/policies."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from approvals.policy import PolicyRights
from approvals.rights import PendingCall, RoleRights
from approvals.signing import DecisionRefusal, statement_for
from commands.catalog import Catalog
from schemas.envelopes import Actor, ActorRef, ApprovalVerdict, DecisionKind, Effect
from streams.approval import Rules, on_authorized
from tests.unit.conftest import NOW, SIGNING
from tests.unit.test_approval import authorized

RIGHTS = PolicyRights.from_directory()


def pending(catalog: Catalog, **kw: Any) -> PendingCall:
    call = authorized(resource_owner="bob@example.com", **kw)
    return PendingCall(call=call, tool=catalog.get(call.tool), owner=call.resource_owner)


def refusal(
    catalog: Catalog,
    who: Actor,
    *,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    kind: DecisionKind = DecisionKind.APPROVER,
    **call: Any,
) -> DecisionRefusal | None:
    target = pending(catalog, **call)
    statement = statement_for(
        call_id=target.call.call_id,
        tenant=target.call.tenant,
        fingerprint=target.call.fingerprint,
        approver=who,
        verdict=verdict,
        now=NOW,
        validity=timedelta(minutes=5),
        kind=kind,
    )
    return RIGHTS.refusal(statement, target)


def actor(sub: str, *roles: str, tenant: str = "tenant-a") -> Actor:
    return Actor(sub=sub, tenant=tenant, roles=roles)


SMALL = {"payment_id": "pay_A1002", "amount_minor": 900, "reason": "r"}
LARGE = {"payment_id": "pay_A1002", "amount_minor": 1500, "reason": "r"}


@pytest.mark.parametrize(
    ("who", "kind", "arguments", "expected"),
    [
        (actor("boss", "approver"), DecisionKind.APPROVER, SMALL, None),
        (
            actor("boss", "approver", tenant="tenant-b"),
            DecisionKind.APPROVER,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        (
            actor("clerk", "support"),
            DecisionKind.APPROVER,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        (actor("agent-1", "approver"), DecisionKind.APPROVER, SMALL, DecisionRefusal.SELF_APPROVAL),
        (actor("clerk", "refund_clerk"), DecisionKind.APPROVER, SMALL, None),
        (
            actor("clerk", "refund_clerk"),
            DecisionKind.APPROVER,
            LARGE,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        (actor("bob@example.com"), DecisionKind.CONFIRMATION, SMALL, None),
        (
            actor("alice@example.com"),
            DecisionKind.CONFIRMATION,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        (
            actor("bob@example.com", tenant="tenant-b"),
            DecisionKind.CONFIRMATION,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        # Owning the resource is no approver right, and a staff role is no ownership.
        (
            actor("bob@example.com"),
            DecisionKind.APPROVER,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
        (
            actor("boss", "approver"),
            DecisionKind.CONFIRMATION,
            SMALL,
            DecisionRefusal.APPROVER_NOT_PERMITTED,
        ),
    ],
    ids=[
        "approver",
        "other-tenant",
        "no-role",
        "self",
        "clerk-small",
        "clerk-over-amount",
        "owner-confirms",
        "other-customer",
        "owner-other-tenant",
        "owner-as-approver",
        "staff-as-owner",
    ],
)
def test_who_may_decide(
    catalog: Catalog,
    who: Actor,
    kind: DecisionKind,
    arguments: dict[str, Any],
    expected: DecisionRefusal | None,
) -> None:
    assert refusal(catalog, who, kind=kind, arguments=arguments) == expected


def test_clerks_do_not_edit_and_four_eyes_for_destructive_effects(catalog: Catalog) -> None:
    clerk = actor("clerk", "refund_clerk")
    assert refusal(catalog, clerk, verdict=ApprovalVerdict.EDIT, arguments=SMALL) is (
        DecisionRefusal.APPROVER_NOT_PERMITTED
    )
    refund = pending(catalog)
    destructive = pending(catalog, effect=Effect.DESTRUCTIVE)
    assert RIGHTS.required_approvals(refund) == 1
    assert RIGHTS.required_approvals(destructive) == 2
    # Four-eyes is for staff: the owner's own confirmation is one person's say.
    assert RIGHTS.required_approvals(destructive, DecisionKind.CONFIRMATION) == 1
    assert RoleRights().required_approvals(destructive, DecisionKind.CONFIRMATION) == 1
    assert RIGHTS.ttl(destructive) == timedelta(hours=1)
    assert RIGHTS.ttl(refund) == (refund.tool.approval_ttl if refund.tool else None)


def test_the_request_names_its_subject_and_approvers(catalog: Catalog) -> None:
    call = authorized(effect=Effect.DESTRUCTIVE, resource_owner="bob@example.com")
    step = on_authorized(
        None,
        call,
        tool=catalog.get(call.tool),
        now=NOW,
        rules=Rules(keys=SIGNING, rights=RIGHTS),
    )
    request = step.emits[0].value
    assert getattr(request, "subject", None) == "bob@example.com"
    assert getattr(request, "required_approvals", None) == 2
    assert step.state is not None and step.state.expires_at == NOW + timedelta(hours=1)


def test_the_owner_confirms_a_call_they_asked_for_themselves(catalog: Catalog) -> None:
    """End-user confirmation is the subject's own say (an MCP user asking for a refund of
    their own payment, then confirming it); staff still never approve their own request."""
    target = pending(catalog, arguments=SMALL)
    own = PendingCall(
        call=target.call.model_copy(
            update={"actor": ActorRef(sub="bob@example.com", roles=("refund", "approver"))}
        ),
        tool=target.tool,
        owner=target.owner,
    )

    def decided(kind: DecisionKind) -> tuple[DecisionRefusal | None, DecisionRefusal | None]:
        statement = statement_for(
            call_id=own.call.call_id,
            tenant=own.call.tenant,
            fingerprint=own.call.fingerprint,
            approver=actor("bob@example.com", "approver"),
            verdict=ApprovalVerdict.APPROVE,
            now=NOW,
            validity=timedelta(minutes=5),
            kind=kind,
        )
        return RIGHTS.refusal(statement, own), RoleRights().refusal(statement, own)

    assert decided(DecisionKind.CONFIRMATION) == (None, None)
    assert decided(DecisionKind.APPROVER) == (
        DecisionRefusal.SELF_APPROVAL,
        DecisionRefusal.SELF_APPROVAL,
    )
