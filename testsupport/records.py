"""Records for tests and benchmarks: an authorized refund, as the authorizer would publish it
for tenant-a's agent with the refund role, and a signed approval of it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from approvals.signing import ApprovalKeys, sign_decision, statement_for
from schemas.envelopes import (
    Actor,
    ActorRef,
    ApprovalDecision,
    ApprovalVerdict,
    AuthorizedCall,
    Effect,
    Route,
)
from schemas.fingerprint import fingerprint


def authorized_refund(
    call_id: str,
    arguments: dict[str, Any],
    *,
    now: datetime,
    effect: Effect = Effect.EXTERNAL_WRITE,
    route: Route = Route.APPROVAL,
    **fields: Any,
) -> AuthorizedCall:
    """`propose_refund` for tenant-a, routed to approval unless ``route`` says otherwise;
    ``fields`` sets any other field of the record."""
    return AuthorizedCall(
        call_id=call_id,
        operation_id=f"tenant-a:{call_id}",
        idempotency_key=call_id,
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=("refund",)),
        tool="propose_refund",
        arguments=arguments,
        fingerprint=fingerprint(
            tenant="tenant-a", tool="propose_refund", arguments=arguments, policy_version="p1"
        ),
        effect=effect,
        policy_version="p1",
        route=route,
        proposed_at=now,
        authorized_at=now,
        **fields,
    )


def signed_approval(
    call: AuthorizedCall,
    keys: ApprovalKeys,
    *,
    approver: Actor,
    now: datetime,
    validity: timedelta,
    key: Any = None,
    kid: str = "",
) -> ApprovalDecision:
    """An approval of ``call`` by ``approver``, signed with ``keys`` (or ``key``/``kid``)."""
    return sign_decision(
        statement_for(
            call_id=call.call_id,
            tenant=call.tenant,
            fingerprint=call.fingerprint,
            approver=approver,
            verdict=ApprovalVerdict.APPROVE,
            now=now,
            validity=validity,
        ),
        keys,
        key=key,
        kid=kid,
    )
