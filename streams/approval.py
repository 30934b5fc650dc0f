"""Approval-join stage: `calls.authorized` + `approvals.decided` → `commands.committed`.

Auto-routed calls are committed at once. A call that needs a human becomes a pending approval
(kept in a changelog-backed table keyed by call id) with an `approvals.requested` record and an
`awaiting_approval` outcome. A decision commits the command only when the approver's token
verifies with the approver role in the call's tenant, the approver is not the requester (unless
the tool allows it), the fingerprint is the pending one, the request has not expired, and the
approval has not been used. Everything here is pure: state in, state and records out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from commands.catalog import Tool
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    ApprovalReceipt,
    ApprovalRequest,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
    Part,
    Route,
    Stage,
    Status,
)
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.emit import Emit, outcome

DEFAULT_APPROVAL_TTL = timedelta(minutes=15)
APPROVER_ROLE = "approver"


class Phase(StrEnum):
    PENDING = "pending"  # request published, waiting for a human
    HELD = "held"  # decisions arrived before their request
    COMMITTED = "committed"  # approved (or edited) and committed: the approval is used
    REJECTED = "rejected"
    EXPIRED = "expired"
    DENIED = "denied"  # an edit did not pass validation or policy


class ApprovalState(Part):
    """What the join remembers about one call id."""

    call_id: str
    phase: Phase
    authorized: AuthorizedCall | None = None
    expires_at: datetime | None = None
    held: tuple[ApprovalDecision, ...] = ()
    held_until: datetime | None = None
    decided_by: str | None = None
    # The `traceparent` of the hop that asked for the approval: decisions and expiry ticks
    # arrive in traces of their own, the call's trace continues from here.
    traceparent: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    kind: str
    tenant: str | None
    call_id: str
    detail: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class EditRequest:
    """An `edit` that passed the approval checks: the new arguments must be validated and
    authorized again (I/O: the resource is re-loaded) before anything is committed."""

    state: ApprovalState
    decision: ApprovalDecision
    approver: Actor


@dataclass(frozen=True, kw_only=True)
class Step:
    state: ApprovalState | None
    emits: tuple[Emit, ...] = ()
    audits: tuple[AuditEntry, ...] = ()
    edit: EditRequest | None = None
    # Decisions to replay now that their request has arrived.
    replay: tuple[ApprovalDecision, ...] = field(default_factory=tuple)


def preview_lines(call: AuthorizedCall, tool: Tool | None) -> tuple[str, ...]:
    """Human-readable lines: what is changed, by how much, for whom, with which effect.
    Secret fields are masked."""
    shown = tool.masked(call.arguments) if tool is not None else call.arguments
    lines = [f"{call.tool} requested by {call.actor.sub} in {call.tenant}"]
    lines.extend(f"{key}: {value}" for key, value in sorted(shown.items()))
    lines.append(f"effect: {call.effect.value}")
    return tuple(lines)


def commit(call: AuthorizedCall, *, now: datetime, receipt: ApprovalReceipt | None = None) -> Emit:
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
            approval=receipt,
            committed_at=now,
        ),
    )


def _audit(kind: str, call: AuthorizedCall | None, call_id: str, **detail: Any) -> AuditEntry:
    if call is not None:
        detail.setdefault("fingerprint", call.fingerprint)
        detail.setdefault("policy_version", call.policy_version)
        detail.setdefault("tool", call.tool)
    return AuditEntry(
        kind=kind, tenant=call.tenant if call else None, call_id=call_id, detail=detail
    )


def _ended(call: AuthorizedCall, status: Status, code: ErrorCode, now: datetime) -> Emit:
    return outcome(
        call_id=call.call_id,
        tool=call.tool,
        tenant=call.tenant,
        status=status,
        stage=Stage.APPROVE,
        code=code,
        at=now,
        policy_version=call.policy_version,
        operation_id=call.operation_id,
        trace_id=call.trace_id,
    )


def on_authorized(
    state: ApprovalState | None,
    call: AuthorizedCall,
    *,
    tool: Tool | None,
    now: datetime,
    ttl: timedelta = DEFAULT_APPROVAL_TTL,
) -> Step:
    """An authorized call arrives: commit it, or open an approval request."""
    if call.route is Route.AUTO:
        return Step(state=state, emits=(commit(call, now=now),))
    if state is not None and state.phase is not Phase.HELD:
        return Step(state=state)  # redelivery: this call already has its request
    ttl = tool.approval_ttl if tool is not None and tool.approval_ttl else ttl
    request = ApprovalRequest(
        call_id=call.call_id,
        operation_id=call.operation_id,
        tenant=call.tenant,
        tool=call.tool,
        arguments=tool.masked(call.arguments) if tool is not None else call.arguments,
        preview=preview_lines(call, tool),
        fingerprint=call.fingerprint,
        effect=call.effect,
        policy_version=call.policy_version,
        requested_by=call.actor.sub,
        expires_at=now + ttl,
    )
    pending = ApprovalState(
        call_id=call.call_id, phase=Phase.PENDING, authorized=call, expires_at=request.expires_at
    )
    return Step(
        state=pending,
        emits=(
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
        ),
        audits=(
            _audit(
                "approval_requested",
                call,
                call.call_id,
                requested_by=call.actor.sub,
                expires_at=request.expires_at.isoformat(),
            ),
        ),
        replay=state.held if state is not None else (),
    )


def decision_problem(
    state: ApprovalState,
    decision: ApprovalDecision,
    approver: Actor | None,
    *,
    now: datetime,
    allow_self_approval: bool,
) -> str | None:
    """Why ``decision`` may not act on ``state``; None when it may."""
    call = state.authorized
    if call is None:
        return "no pending request"
    if state.phase is not Phase.PENDING:
        return f"approval already {state.phase.value}"
    if approver is None:
        return "approver token does not verify"
    if approver.tenant != call.tenant:
        return "approver belongs to another tenant"
    if APPROVER_ROLE not in approver.roles:
        return "approver lacks the approver role"
    if approver.sub == call.actor.sub and not allow_self_approval:
        return "requester cannot approve their own call"
    if decision.fingerprint != call.fingerprint:
        return "fingerprint does not match the pending request"
    if state.expires_at is not None and decision.decided_at >= state.expires_at:
        return "decided after the request expired"
    if state.expires_at is not None and now >= state.expires_at:
        return "arrived after the request expired"
    if decision.decision is ApprovalVerdict.EDIT and not decision.arguments:
        return "an edit needs arguments"
    return None


def on_decided(
    state: ApprovalState | None,
    decision: ApprovalDecision,
    approver: Actor | None,
    *,
    tool: Tool | None,
    now: datetime,
    hold: timedelta,
) -> Step:
    """A human's decision arrives (or is replayed after its request arrived)."""
    if state is None or state.phase is Phase.HELD:
        held = (*(state.held if state else ()), decision)
        return Step(
            state=ApprovalState(
                call_id=decision.call_id,
                phase=Phase.HELD,
                held=held,
                held_until=state.held_until if state and state.held_until else now + hold,
            ),
            audits=(
                AuditEntry(
                    kind="approval_decision_held",
                    tenant=approver.tenant if approver else None,
                    call_id=decision.call_id,
                    detail=_decision_detail(decision, approver, "request not seen yet"),
                ),
            ),
        )
    problem = decision_problem(
        state,
        decision,
        approver,
        now=now,
        allow_self_approval=tool.allow_self_approval if tool is not None else False,
    )
    call = state.authorized
    if problem is not None or call is None or approver is None:
        return Step(
            state=state,
            audits=(
                _audit(
                    "approval_decision_invalid",
                    call,
                    decision.call_id,
                    **_decision_detail(decision, approver, problem or "invalid"),
                ),
            ),
        )
    valid = _audit(
        "approval_decision",
        call,
        decision.call_id,
        **_decision_detail(decision, approver, decision.reason or ""),
    )
    if decision.decision is ApprovalVerdict.REJECT:
        return Step(
            state=state.model_copy(update={"phase": Phase.REJECTED, "decided_by": approver.sub}),
            emits=(_ended(call, Status.REJECTED, ErrorCode.APPROVAL_REJECTED, now),),
            audits=(valid,),
        )
    if decision.decision is ApprovalVerdict.EDIT:
        return Step(
            state=state,
            audits=(valid,),
            edit=EditRequest(state=state, decision=decision, approver=approver),
        )
    receipt = ApprovalReceipt(
        approver=approver.sub,
        decided_at=decision.decided_at,
        expires_at=state.expires_at or now,
        fingerprint=call.fingerprint,
    )
    return Step(
        state=state.model_copy(update={"phase": Phase.COMMITTED, "decided_by": approver.sub}),
        emits=(commit(call, now=now, receipt=receipt),),
        audits=(valid,),
    )


def edited(
    edit: EditRequest,
    reauthorized: AuthorizedCall | tuple[ErrorCode, Status],
    *,
    now: datetime,
) -> Step:
    """Finish an edit: commit the re-authorized arguments bound to the editor's decision, or
    end the call with the typed reason the edit failed for."""
    state, call = edit.state, edit.state.authorized
    assert call is not None
    if isinstance(reauthorized, tuple):
        code, status = reauthorized
        return Step(
            state=state.model_copy(update={"phase": Phase.DENIED, "decided_by": edit.approver.sub}),
            emits=(_ended(call, status, code, now),),
            audits=(
                _audit(
                    "approval_edit_refused",
                    call,
                    call.call_id,
                    code=code.value,
                    approver=edit.approver.sub,
                ),
            ),
        )
    receipt = ApprovalReceipt(
        approver=edit.approver.sub,
        decided_at=edit.decision.decided_at,
        expires_at=state.expires_at or now,
        fingerprint=reauthorized.fingerprint,
    )
    return Step(
        state=state.model_copy(
            update={
                "phase": Phase.COMMITTED,
                "decided_by": edit.approver.sub,
                "authorized": reauthorized,
            }
        ),
        emits=(commit(reauthorized, now=now, receipt=receipt),),
        audits=(
            _audit(
                "approval_edit_committed",
                reauthorized,
                call.call_id,
                approver=edit.approver.sub,
                original_fingerprint=call.fingerprint,
            ),
        ),
    )


def on_tick(state: ApprovalState | None, *, now: datetime) -> Step:
    """The timer's nudge: expire a request nobody decided in time; drop decisions whose own
    hold time passed without their request."""
    if state is None:
        return Step(state=None)
    if state.phase is Phase.PENDING and state.expires_at and now >= state.expires_at:
        call = state.authorized
        assert call is not None
        return Step(
            state=state.model_copy(update={"phase": Phase.EXPIRED}),
            emits=(_ended(call, Status.EXPIRED, ErrorCode.APPROVAL_EXPIRED, now),),
            audits=(
                _audit(
                    "approval_expired", call, call.call_id, expires_at=state.expires_at.isoformat()
                ),
            ),
        )
    if state.phase is Phase.HELD and state.held_until and now >= state.held_until:
        return Step(
            state=None,
            audits=tuple(
                AuditEntry(
                    kind="approval_decision_dropped",
                    tenant=None,
                    call_id=d.call_id,
                    detail=_decision_detail(d, None, "request never arrived"),
                )
                for d in state.held
            ),
        )
    return Step(state=state)


def due(state: ApprovalState, now: datetime) -> bool:
    """Whether the timer should nudge this state."""
    if state.phase is Phase.PENDING:
        return state.expires_at is not None and now >= state.expires_at
    if state.phase is Phase.HELD:
        return state.held_until is not None and now >= state.held_until
    return False


def _decision_detail(
    decision: ApprovalDecision, approver: Actor | None, reason: str
) -> dict[str, Any]:
    return {
        "decision": decision.decision.value,
        "approver": approver.sub if approver else None,
        "approver_tenant": approver.tenant if approver else None,
        "decision_fingerprint": decision.fingerprint,
        "decided_at": decision.decided_at.isoformat(),
        "reason": reason,
    }
