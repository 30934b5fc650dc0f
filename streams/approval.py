"""Approval-join stage: `calls.authorized` → `commands.committed`, or an approval request.

Auto-routed calls are committed at once. Calls that need a human produce an
`approvals.requested` record and an `awaiting_approval` outcome.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from commands.catalog import Tool
from schemas.envelopes import (
    ApprovalRequest,
    AuthorizedCall,
    CommittedCommand,
    Route,
    Stage,
    Status,
)
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.emit import Emit, outcome

DEFAULT_APPROVAL_TTL = timedelta(minutes=15)


def preview_lines(call: AuthorizedCall, tool: Tool | None) -> tuple[str, ...]:
    """Human-readable lines: what is changed, by how much, for whom, with which effect.
    Secret fields are masked."""
    shown = tool.masked(call.arguments) if tool is not None else call.arguments
    lines = [f"{call.tool} requested by {call.actor.sub} in {call.tenant}"]
    lines.extend(f"{key}: {value}" for key, value in sorted(shown.items()))
    lines.append(f"effect: {call.effect.value}")
    return tuple(lines)


def commit(call: AuthorizedCall, *, now: datetime) -> Emit:
    return Emit(
        topic=Topic.COMMITTED,
        key=call.operation_id,
        value=CommittedCommand(
            operation_id=call.operation_id,
            call_id=call.call_id,
            tenant=call.tenant,
            actor=call.actor,
            tool=call.tool,
            arguments=call.arguments,
            fingerprint=call.fingerprint,
            effect=call.effect,
            policy_version=call.policy_version,
            approval=None,
            committed_at=now,
        ),
    )


def on_authorized(
    call: AuthorizedCall,
    *,
    tool: Tool | None,
    now: datetime,
    ttl: timedelta = DEFAULT_APPROVAL_TTL,
) -> tuple[Emit, ...]:
    if call.route is Route.AUTO:
        return (commit(call, now=now),)
    request = ApprovalRequest(
        call_id=call.call_id,
        operation_id=call.operation_id,
        tenant=call.tenant,
        tool=call.tool,
        arguments=call.arguments,
        preview=preview_lines(call, tool),
        fingerprint=call.fingerprint,
        effect=call.effect,
        policy_version=call.policy_version,
        requested_by=call.actor.sub,
        expires_at=now + ttl,
    )
    return (
        Emit(topic=Topic.APPROVALS_REQUESTED, key=call.call_id, value=request),
        outcome(
            call_id=call.call_id,
            tool=call.tool,
            tenant=call.tenant,
            status=Status.AWAITING_APPROVAL,
            stage=Stage.APPROVE,
            code=ErrorCode.APPROVAL_REQUIRED,
            at=now,
            policy_version=call.policy_version,
            operation_id=call.operation_id,
            trace_id=call.trace_id,
        ),
    )
