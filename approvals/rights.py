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
from schemas.envelopes import AuthorizedCall, DecisionKind, DecisionStatement, Effect

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
