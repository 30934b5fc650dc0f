"""Records for tests and benchmarks: an authorized refund, as the authorizer would publish it
for tenant-a's agent with the refund role, a signed approval of it, and an approved committed
command of tenant-a's agent, as the approval-join would publish it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from approvals.signing import ApprovalKeys, receipt_for, sign_decision, statement_for
from schemas.envelopes import (
    Actor,
    ActorRef,
    ApprovalDecision,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
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


def approved_command(
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str,
    call_id: str,
    effect: Effect,
    policy_version: str,
    keys: ApprovalKeys,
    now: datetime,
    validity: timedelta,
    approver: str = "boss",
) -> CommittedCommand:
    """``tool`` with ``arguments`` for tenant-a's agent with the refund role, committed with a
    receipt of ``approver``'s approval signed with ``keys`` (operation ``tenant-a:<key>``)."""
    fp = fingerprint(
        tenant="tenant-a", tool=tool, arguments=arguments, policy_version=policy_version
    )
    return CommittedCommand(
        operation_id=f"tenant-a:{key}",
        call_id=call_id,
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=("refund",)),
        tool=tool,
        arguments=arguments,
        fingerprint=fp,
        effect=effect,
        policy_version=policy_version,
        approval=receipt_for(
            call_id=call_id,
            tenant="tenant-a",
            fingerprint=fp,
            policy_version=policy_version,
            approver=approver,
            decided_at=now,
            expires_at=now + validity,
            keys=keys,
        ),
        committed_at=now,
    )
