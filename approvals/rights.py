"""Who may decide about a pending call, and how many must. Pure.

`RoleRights` is the built-in rule (the approver role in the call's tenant, no self-approval
unless the tool allows it, two distinct approvers for destructive effects; the resource's
owner confirms with one confirmation). The approval-join uses
`approvals.policy.PolicyRights` (Cedar) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from approvals.signing import DecisionRefusal
from commands.catalog import Tool
from schemas.envelopes import (
    ActorRef,
    ApprovalRequest,
    ApprovalVerdict,
    AuthorizedCall,
    DecisionKind,
    DecisionStatement,
    Effect,
    Route,
)

APPROVER_ROLE = "approver"


@dataclass(frozen=True, kw_only=True)
class PendingCall:
    """What approver rights are decided on: the call, its tool, and whom its resource
    belongs to (the subject who may confirm it), when the loader says."""

    call: AuthorizedCall
    tool: Tool | None
    owner: str | None = None


class ApproverRights(Protocol):
    def refusal(self, statement: DecisionStatement, pending: PendingCall) -> DecisionRefusal | None:
        """Why this approver may not take this decision on this call; None when they may."""

    def required_approvals(
        self, pending: PendingCall, kind: DecisionKind = DecisionKind.APPROVER
    ) -> int:
        """How many distinct approvers must approve: staff (``approver``), or where the
        decision is the owner's own ``confirmation``."""

    def awaits_confirmation(self, pending: PendingCall) -> bool:
        """Whether the subject the call acts for (the resource's owner) may confirm it: the
        call then waits for their confirmation, and says so."""

    def ttl(self, pending: PendingCall) -> timedelta | None:
        """How long the request waits (None: the tool's or the deployment's default)."""


@dataclass(frozen=True, kw_only=True)
class RoleRights:
    role: str = APPROVER_ROLE

    def refusal(self, statement: DecisionStatement, pending: PendingCall) -> DecisionRefusal | None:
        call, approver = pending.call, statement.approver
        if approver.tenant != call.tenant:
            return DecisionRefusal.APPROVER_NOT_PERMITTED
        if statement.kind is DecisionKind.CONFIRMATION:
            # The subject the call acts for confirms it: the resource's owner, and only them.
            if pending.owner is None or approver.sub != pending.owner:
                return DecisionRefusal.APPROVER_NOT_PERMITTED
            return None
        if self.role not in approver.roles:
            return DecisionRefusal.APPROVER_NOT_PERMITTED
        allowed = pending.tool is not None and pending.tool.allow_self_approval
        if approver.sub == call.actor.sub and not allowed:
            return DecisionRefusal.SELF_APPROVAL
        return None

    def required_approvals(
        self, pending: PendingCall, kind: DecisionKind = DecisionKind.APPROVER
    ) -> int:
        # Four-eyes is for staff: a customer confirming their own action is one person.
        if kind is DecisionKind.CONFIRMATION:
            return 1
        return 2 if pending.call.effect is Effect.DESTRUCTIVE else 1

    def awaits_confirmation(self, pending: PendingCall) -> bool:
        return pending.owner is not None

    def ttl(self, pending: PendingCall) -> timedelta | None:
        return pending.tool.approval_ttl if pending.tool is not None else None


def approver_refusal(
    statement: DecisionStatement,
    pending: PendingCall,
    *,
    rights: ApproverRights,
    approved_by: tuple[str, ...],
    required_approvals: int,
) -> DecisionRefusal | None:
    """Why this approver may not take this decision on a call still pending, given who
    approved it so far; None when they may. The approval-join decides with it, and the
    approver surfaces (HTTP API, dashboard) check it before publishing a decision."""
    refused = rights.refusal(statement, pending)
    if refused is not None:
        return refused
    if statement.decision is not ApprovalVerdict.EDIT and statement.arguments is not None:
        return DecisionRefusal.ARGUMENTS_WITHOUT_EDIT
    if statement.decision is ApprovalVerdict.APPROVE and statement.approver.sub in approved_by:
        return DecisionRefusal.SAME_APPROVER
    if statement.decision is ApprovalVerdict.EDIT and (
        not statement.arguments or required_approvals > 1
    ):
        # An edit replaces the arguments others approved: only where one approver suffices.
        return DecisionRefusal.EDIT_WITHOUT_ARGUMENTS
    return None


def pending_from_request(request: ApprovalRequest, tool: Tool | None) -> PendingCall:
    """The pending call as its approval request shows it (what approver rights read: tool,
    effect, tenant, requester, owner, arguments), for checks before a decision is published.
    The request's arguments are masked: no approver rule reads a secret field."""
    call = AuthorizedCall(
        call_id=request.call_id,
        operation_id=request.operation_id,
        idempotency_key=request.call_id,
        tenant=request.tenant,
        actor=ActorRef(sub=request.requested_by),
        tool=request.tool,
        arguments=request.arguments,
        fingerprint=request.fingerprint,
        effect=request.effect,
        policy_version=request.policy_version,
        route=Route.APPROVAL,
        proposed_at=request.expires_at,
        authorized_at=request.expires_at,
        resource_owner=request.subject,
    )
    return PendingCall(call=call, tool=tool, owner=request.subject)
