"""Approval-join stage: `calls.authorized` + `approvals.decided` → `commands.committed`.

Auto-routed calls the authorizer did not commit itself (streams/commit.py) are committed at
once: with a signed receipt naming the policy when their effect would need an approval, or
without one (a record of an older authorizer). A call that needs a human becomes a pending
approval (kept in a changelog-backed table keyed by call id) with an `approvals.requested`
record and an `awaiting_approval` outcome. A decision is a signed statement
(`approvals.signing`); it commits the command only when it verifies, names this call, its
tenant and fingerprint, was not used before, the approver has the rights
(`approvals.rights`) and enough distinct approvers approved. Anything else is refused with a
typed reason in the audit and changes nothing. Terminal states are forgotten (deleted) once
no reuse could arrive any more. Everything here is pure: state in, state and records out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from approvals.rights import ApproverRights, PendingCall, RoleRights, approver_refusal
from approvals.signing import (
    ApprovalKeys,
    DecisionRefusal,
    VerifiedDecision,
    sign_receipt,
)
from commands.catalog import Tool
from schemas.envelopes import (
    ApprovalDecision,
    ApprovalReceipt,
    ApprovalRequest,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
    DecisionKind,
    DecisionStatement,
    ErrorInfo,
    FreezeRecord,
    Outcome,
    Part,
    Route,
    SourcePosition,
    Stage,
    Status,
)
from schemas.errors import AWAITING_CONFIRMATION_MESSAGE, ErrorCode
from schemas.names import Topic
from schemas.vocabulary import AuditKind
from streams.commit import auto_receipt_needed, commit, committed_by_authorizer
from streams.emit import Emit, dead_letter, outcome

DEFAULT_APPROVAL_TTL = timedelta(minutes=15)
DEFAULT_RIGHTS = RoleRights()
# Decisions held for a request not seen yet, per call: a flood of them cannot grow the state.
MAX_HELD = 8
# Repeats of one operation that join its request (v1.5); more open requests of their own.
MAX_FOLLOWERS = 32


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
    # Distinct approvers who approved so far, and every decision id that counted.
    approvals: tuple[str, ...] = ()
    decision_ids: tuple[str, ...] = ()
    required_approvals: int = 1
    # A terminal state is deleted at this time (no decision can still be replayed usefully).
    forget_at: datetime | None = None
    # The `traceparent` of the hop that asked for the approval: decisions and expiry ticks
    # arrive in traces of their own, the call's trace continues from here.
    traceparent: str | None = None
    # v1.5: later calls of the same operation (tenant + idempotency key, same fingerprint)
    # that joined this request (streams/repeats.py): each gets this request's final outcome.
    followers: tuple[AuthorizedCall, ...] = ()
    # How a request that ended without its command running ended (a follower arriving
    # after that is told the same).
    ended_status: Status | None = None
    ended_error: ErrorInfo | None = None


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    kind: AuditKind
    tenant: str | None
    call_id: str
    detail: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class EditRequest:
    """An `edit` that passed the approval checks: the new arguments must be validated and
    authorized again (I/O: the resource is re-loaded) before anything is committed."""

    state: ApprovalState
    statement: DecisionStatement


@dataclass(frozen=True, kw_only=True)
class EndedRequest:
    """The call that held an operation's approval request, and the outcome it ended with
    (rejected, expired, a refused edit): the operation's final outcome."""

    call: AuthorizedCall
    outcome: Outcome


@dataclass(frozen=True, kw_only=True)
class Rules:
    """What the join decides with besides the state: keys to sign receipts, approver rights,
    default TTL, how long a decision waits for its request, how long terminal states stay."""

    keys: ApprovalKeys
    rights: ApproverRights = DEFAULT_RIGHTS
    ttl: timedelta = DEFAULT_APPROVAL_TTL
    hold: timedelta = timedelta(seconds=60)
    retention: timedelta = timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class Step:
    state: ApprovalState | None
    emits: tuple[Emit, ...] = ()
    audits: tuple[AuditEntry, ...] = ()
    edit: EditRequest | None = None
    # Decisions to replay now that their request has arrived.
    replay: tuple[ApprovalDecision, ...] = field(default_factory=tuple)
    # Requests that ended without their command running: the operation's final outcome,
    # kept with its row in `approval_requests` (a later call of the operation is told it).
    ended: tuple[EndedRequest, ...] = ()


def preview_lines(call: AuthorizedCall, tool: Tool | None) -> tuple[str, ...]:
    """Human-readable lines: what is changed, by how much, for whom, with which effect.
    Secret fields are masked."""
    shown = tool.masked(call.arguments) if tool is not None else call.arguments
    lines = [f"{call.tool} requested by {call.actor.sub} in {call.tenant}"]
    lines.extend(f"{key}: {value}" for key, value in sorted(shown.items()))
    lines.append(f"effect: {call.effect.value}")
    return tuple(lines)


def _audit(kind: AuditKind, call: AuthorizedCall | None, call_id: str, **detail: Any) -> AuditEntry:
    if call is not None:
        detail.setdefault("fingerprint", call.fingerprint)
        detail.setdefault("policy_version", call.policy_version)
        detail.setdefault("tool", call.tool)
    return AuditEntry(
        kind=kind, tenant=call.tenant if call else None, call_id=call_id, detail=detail
    )


def _ended(
    call: AuthorizedCall,
    status: Status,
    code: ErrorCode,
    now: datetime,
    *,
    error: ErrorInfo | None = None,
    repeats: str | None = None,
) -> Emit:
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
        error=error,
        reply_to=call.reply_to,
        repeats=repeats,
    )


def _awaiting(
    call: AuthorizedCall, now: datetime, *, error: ErrorInfo, repeats: str | None = None
) -> Emit:
    return _ended(
        call,
        Status.AWAITING_APPROVAL,
        ErrorCode.APPROVAL_REQUIRED,
        now,
        error=error,
        repeats=repeats,
    )


def _ended_all(
    state: ApprovalState,
    call: AuthorizedCall,
    status: Status,
    error: ErrorInfo,
    now: datetime,
) -> tuple[tuple[Emit, ...], tuple[EndedRequest, ...]]:
    """The outcome of a request that ended without its command running, for its call and
    every call that joined it; and the operation's final outcome to keep."""
    code = error.code
    own = _ended(call, status, code, now, error=error)
    assert isinstance(own.value, Outcome)
    emits = (
        own,
        *(_ended(f, status, code, now, error=error, repeats=call.call_id) for f in state.followers),
    )
    return emits, (EndedRequest(call=call, outcome=own.value),)


def _follower_commits(
    state: ApprovalState,
    call: AuthorizedCall,
    *,
    now: datetime,
    rules: Rules,
    followers: tuple[AuthorizedCall, ...],
    basis: str,
) -> tuple[Emit, ...]:
    """The command of each follower: the committed operation (same operation id, fingerprint
    and arguments) under the follower's call id, with a receipt signed for that call. The
    executor answers it from its ledger, as any repeat of an operation: one effect."""
    emits = []
    for follower in followers:
        as_follower = call.model_copy(
            update={
                "call_id": follower.call_id,
                "reply_to": follower.reply_to,
                "trace_id": follower.trace_id,
            }
        )
        receipt = _receipt(
            as_follower,
            approvers=state.approvals or (state.decided_by or "-",),
            decision_ids=state.decision_ids,
            decided_at=now,
            expires_at=state.expires_at or now,
            basis=basis,
            keys=rules.keys,
        )
        emits.append(commit(as_follower, now=now, receipt=receipt))
    return tuple(emits)


def on_joining(
    state: ApprovalState | None, call: AuthorizedCall, *, now: datetime, rules: Rules
) -> Step:
    """A later call of an operation whose request is (or was) kept under this key
    (``call.joins``, streams/repeats.py): it joins that request instead of opening one.
    Pending → it waits with it; ended → it gets the same end; not seen (yet) → it is held
    with the state until the request arrives, or opens its own when the hold ends."""
    joins = call.joins or call.call_id
    if state is not None and any(f.call_id == call.call_id for f in state.followers):
        return Step(state=state)  # redelivery: already joined
    if state is not None and len(state.followers) >= MAX_FOLLOWERS:
        return Step(state=state, emits=(_on_its_own(call),))
    joined = _audit(AuditKind.APPROVAL_JOINED, call, call.call_id, joins=joins)
    if state is None or state.phase is Phase.HELD:
        base = state or ApprovalState(call_id=joins, phase=Phase.HELD)
        return Step(
            state=base.model_copy(
                update={
                    "followers": (*base.followers, call),
                    "held_until": base.held_until or now + rules.hold,
                }
            ),
            audits=(joined,),
        )
    with_it = state.model_copy(update={"followers": (*state.followers, call)})
    leader = state.authorized
    if state.phase is Phase.PENDING:
        # Waiting on the leader's request: the same words as the leader's own outcome.
        asking = leader or call
        error = awaiting_error(
            rules.rights, PendingCall(call=asking, tool=None, owner=asking.resource_owner)
        )
        waits = _awaiting(call, now, error=error, repeats=joins)
        return Step(state=with_it, emits=(waits,), audits=(joined,))
    if state.phase is Phase.COMMITTED and leader is not None:
        commits = _follower_commits(
            state, leader, now=now, rules=rules, followers=(call,), basis="approval"
        )
        return Step(state=with_it, emits=commits, audits=(joined,))
    # A state ended before v1.5 kept no end: its phase says which.
    status, code = _PHASE_ENDS.get(state.phase, (Status.EXPIRED, ErrorCode.APPROVAL_EXPIRED))
    status = state.ended_status or status
    error = state.ended_error or ErrorInfo.of(code)
    return Step(
        state=with_it,
        emits=(_ended(call, status, error.code, now, error=error, repeats=joins),),
        audits=(joined,),
    )


_PHASE_ENDS = {
    Phase.REJECTED: (Status.REJECTED, ErrorCode.APPROVAL_REJECTED),
    Phase.EXPIRED: (Status.EXPIRED, ErrorCode.APPROVAL_EXPIRED),
    Phase.DENIED: (Status.DENIED, ErrorCode.POLICY_DENIED),
}


def _on_its_own(call: AuthorizedCall) -> Emit:
    """A joining call sent back to open its own request (keyed by its own call id)."""
    return Emit(
        topic=Topic.AUTHORIZED, key=call.call_id, value=call.model_copy(update={"joins": None})
    )


def _forget_at(state: ApprovalState, now: datetime, rules: Rules) -> datetime:
    """When a terminal state may go: after the request's expiry (no decision signed by the
    service outlives it), plus the allowed clock skew, plus the retention margin."""
    skew = timedelta(seconds=rules.keys.leeway_seconds)
    return max(state.expires_at or now, now) + skew + rules.retention


def _terminal(
    state: ApprovalState, phase: Phase, now: datetime, rules: Rules, **update: Any
) -> ApprovalState:
    base = state.model_copy(update={"phase": phase, **update})
    return base.model_copy(update={"forget_at": _forget_at(base, now, rules)})


def _receipt(
    call: AuthorizedCall,
    *,
    approvers: tuple[str, ...],
    decision_ids: tuple[str, ...],
    decided_at: datetime,
    expires_at: datetime,
    basis: str,
    keys: ApprovalKeys,
    auto_policy: str | None = None,
) -> ApprovalReceipt:
    return sign_receipt(
        ApprovalReceipt(
            approver=approvers[-1],
            decided_at=decided_at,
            expires_at=expires_at,
            fingerprint=call.fingerprint,
            call_id=call.call_id,
            tenant=call.tenant,
            policy_version=call.policy_version,
            approvers=approvers,
            decision_ids=decision_ids,
            basis=basis,
            auto_policy=auto_policy,
        ),
        keys,
    )


def auto_commit(call: AuthorizedCall, *, now: datetime, rules: Rules) -> Step:
    """`@approval("auto")` on an effect that needs an approval: the policy is the approver.
    The call's command with a receipt signed for that policy (the executor verifies it as
    any receipt), and its audit row. The authorizer commits such calls so (one hop fewer
    than through the join: docs/measurements.md, "Where an auto-approved write is signed")."""
    approver = f"policy:{call.auto_approved_by}"
    receipt = _receipt(
        call,
        approvers=(approver,),
        decision_ids=(f"auto-{call.call_id}",),
        decided_at=now,
        expires_at=now + rules.ttl,
        basis="auto",
        keys=rules.keys,
        auto_policy=call.auto_approved_by,
    )
    return Step(
        state=None,
        emits=(commit(call, now=now, receipt=receipt),),
        audits=(_audit(AuditKind.APPROVAL_AUTO, call, call.call_id, policy=call.auto_approved_by),),
    )


def auto_audits(emits: Sequence[Emit]) -> tuple[AuditEntry, ...]:
    """The audit rows of the auto-approved commands among ``emits`` (what ``auto_commit``
    audits, read back from its command: the authorizer writes them beside its output)."""
    entries = []
    for emit in emits:
        command = emit.value
        if not isinstance(command, CommittedCommand) or command.approval is None:
            continue
        if command.approval.basis != "auto":
            continue
        entries.append(
            AuditEntry(
                kind=AuditKind.APPROVAL_AUTO,
                tenant=command.tenant,
                call_id=command.call_id,
                detail={
                    "policy": command.approval.auto_policy,
                    "fingerprint": command.fingerprint,
                    "policy_version": command.policy_version,
                    "tool": command.tool,
                },
            )
        )
    return tuple(entries)


def on_authorized(
    state: ApprovalState | None,
    call: AuthorizedCall,
    *,
    tool: Tool | None,
    now: datetime,
    rules: Rules,
) -> Step:
    """An authorized call arrives: commit it, or open an approval request. A call the
    authorizer committed itself (streams/commit.py) is not the join's: nothing happens. A
    call that joins the request under this key is ``on_joining``'s."""
    if call.joins is not None and call.joins != call.call_id and call.route is Route.APPROVAL:
        return on_joining(state, call, now=now, rules=rules)
    if call.route is Route.AUTO:
        if committed_by_authorizer(call):
            return Step(state=state)
        if not auto_receipt_needed(call):  # an older authorizer's record: committed here
            return Step(state=state, emits=(commit(call, now=now),))
        # An older authorizer's `@approval("auto")` call (since issue 44 the authorizer
        # commits them itself, with the same receipt: ``auto_commit``).
        auto = auto_commit(call, now=now, rules=rules)
        return Step(state=state, emits=auto.emits, audits=auto.audits)
    if state is not None and state.phase is not Phase.HELD:
        return Step(state=state)  # redelivery: this call already has its request
    pending_call = PendingCall(call=call, tool=tool, owner=call.resource_owner)
    ttl = rules.rights.ttl(pending_call) or rules.ttl
    required = rules.rights.required_approvals(pending_call)
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
        subject=call.resource_owner,
        required_approvals=required,
        reply_to=call.reply_to,
    )
    followers = state.followers if state is not None else ()
    pending = ApprovalState(
        call_id=call.call_id,
        phase=Phase.PENDING,
        authorized=call,
        expires_at=request.expires_at,
        required_approvals=required,
        followers=followers,
    )
    return Step(
        state=pending,
        emits=(
            Emit(topic=Topic.APPROVALS_REQUESTED, key=call.call_id, value=request),
            _awaiting(call, now, error=awaiting_error(rules.rights, pending_call)),
            *(
                _awaiting(
                    f, now, error=awaiting_error(rules.rights, pending_call), repeats=call.call_id
                )
                for f in followers
            ),
        ),
        audits=(
            _audit(
                AuditKind.APPROVAL_REQUESTED,
                call,
                call.call_id,
                requested_by=call.actor.sub,
                expires_at=request.expires_at.isoformat(),
                required_approvals=required,
            ),
        ),
        replay=state.held if state is not None else (),
    )


def awaiting_error(rights: ApproverRights, pending: PendingCall) -> ErrorInfo:
    """What a waiting call's outcome says: that it waits for the customer's confirmation
    when its resource's owner may confirm it, else that a human must approve it."""
    if rights.awaits_confirmation(pending):
        return ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, AWAITING_CONFIRMATION_MESSAGE)
    return ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED)


def decision_refusal(
    state: ApprovalState,
    statement: DecisionStatement,
    *,
    tool: Tool | None,
    now: datetime,
    rights: ApproverRights,
) -> DecisionRefusal | None:
    """Why a verified ``statement`` may not act on ``state``; None when it may."""
    call = state.authorized
    if statement.decision_id in state.decision_ids:
        return DecisionRefusal.DECISION_REUSED
    if call is None or state.phase is not Phase.PENDING:
        return DecisionRefusal.NOT_PENDING
    if statement.call_id != call.call_id:
        return DecisionRefusal.CALL_MISMATCH
    if statement.tenant != call.tenant:
        return DecisionRefusal.TENANT_MISMATCH
    if statement.fingerprint != call.fingerprint:
        return DecisionRefusal.FINGERPRINT_MISMATCH
    if state.expires_at is not None and (
        now >= state.expires_at or statement.issued_at >= state.expires_at
    ):
        return DecisionRefusal.REQUEST_EXPIRED
    # The approver surfaces check the same rule before they publish (approvals.rights).
    return approver_refusal(
        statement,
        PendingCall(call=call, tool=tool, owner=call.resource_owner),
        rights=rights,
        approved_by=state.approvals,
        required_approvals=state.required_approvals,
    )


def on_decided(
    state: ApprovalState | None,
    decision: ApprovalDecision,
    verified: VerifiedDecision | DecisionRefusal,
    *,
    call_id: str,
    tool: Tool | None,
    now: datetime,
    rules: Rules,
) -> Step:
    """A decision arrives (or is replayed after its request arrived). ``call_id`` is the
    Kafka key: the call whose state this is."""
    call = state.authorized if state is not None else None
    if isinstance(verified, DecisionRefusal):
        return Step(
            state=state,
            audits=(_refused(call, call_id, decision, None, verified),),
        )
    statement = verified.statement
    if state is None or state.phase is Phase.HELD:
        held = (*(state.held if state else ()), decision)[-MAX_HELD:]
        return Step(
            state=ApprovalState(
                call_id=call_id,
                phase=Phase.HELD,
                held=held,
                held_until=state.held_until if state and state.held_until else now + rules.hold,
                followers=state.followers if state else (),
            ),
            audits=(
                AuditEntry(
                    kind=AuditKind.APPROVAL_DECISION_HELD,
                    tenant=statement.tenant,
                    call_id=call_id,
                    detail=_statement_detail(decision, statement, "request not seen yet"),
                ),
            ),
        )
    refusal = decision_refusal(state, statement, tool=tool, now=now, rights=rules.rights)
    if refusal is not None or call is None:
        return Step(
            state=state,
            audits=(
                _refused(
                    call, call_id, decision, statement, refusal or DecisionRefusal.NOT_PENDING
                ),
            ),
        )
    valid = _audit(
        AuditKind.APPROVAL_DECISION,
        call,
        call_id,
        **_statement_detail(decision, statement, statement.reason or ""),
    )
    sub = statement.approver.sub
    used = (*state.decision_ids, statement.decision_id)
    if statement.decision is ApprovalVerdict.REJECT:
        error = ErrorInfo.approver_rejected(
            statement.reason, by_customer=statement.kind is DecisionKind.CONFIRMATION
        )
        emits, ended = _ended_all(state, call, Status.REJECTED, error, now)
        return Step(
            state=_terminal(
                state,
                Phase.REJECTED,
                now,
                rules,
                decided_by=sub,
                decision_ids=used,
                ended_status=Status.REJECTED,
                ended_error=error,
            ),
            emits=emits,
            audits=(valid,),
            ended=ended,
        )
    if statement.decision is ApprovalVerdict.EDIT:
        marked = state.model_copy(update={"decision_ids": used})
        return Step(
            state=marked,
            audits=(valid,),
            edit=EditRequest(state=marked, statement=statement),
        )
    approvals = (*state.approvals, sub)
    required = state.required_approvals
    if statement.kind is DecisionKind.CONFIRMATION:
        # The owner's own confirmation: four-eyes (a rule for staff) does not apply to it.
        required = rules.rights.required_approvals(
            PendingCall(call=call, tool=tool, owner=call.resource_owner), kind=statement.kind
        )
    if len(approvals) < required:
        return Step(
            state=state.model_copy(update={"approvals": approvals, "decision_ids": used}),
            audits=(
                _audit(
                    AuditKind.APPROVAL_DECISION,
                    call,
                    call_id,
                    **_statement_detail(decision, statement, statement.reason or ""),
                    approvals=len(approvals),
                    required_approvals=required,
                ),
            ),
        )
    return _approved(
        state,
        call,
        statement,
        approvers=approvals,
        decision_ids=used,
        now=now,
        rules=rules,
        audits=(valid,),
    )


def _approved(
    state: ApprovalState,
    call: AuthorizedCall,
    statement: DecisionStatement,
    *,
    approvers: tuple[str, ...],
    decision_ids: tuple[str, ...],
    now: datetime,
    rules: Rules,
    audits: tuple[AuditEntry, ...],
    **update: Any,
) -> Step:
    """Commit ``call`` with a receipt signed for ``approvers``; the state ends committed."""
    receipt = _receipt(
        call,
        approvers=approvers,
        decision_ids=decision_ids,
        decided_at=statement.issued_at,
        expires_at=state.expires_at or now,
        basis=statement.kind.value,
        keys=rules.keys,
    )
    committed = _terminal(
        state,
        Phase.COMMITTED,
        now,
        rules,
        decided_by=statement.approver.sub,
        approvals=approvers,
        decision_ids=decision_ids,
        **update,
    )
    # The operation's command first: the followers' (same operation id, so the same
    # partition, after it) are answered from the ledger.
    followers = _follower_commits(
        committed,
        call,
        now=now,
        rules=rules,
        followers=state.followers,
        basis=statement.kind.value,
    )
    return Step(
        state=committed,
        emits=(commit(call, now=now, receipt=receipt), *followers),
        audits=audits,
    )


def edited(
    edit: EditRequest,
    reauthorized: AuthorizedCall | tuple[ErrorCode, Status],
    *,
    now: datetime,
    rules: Rules,
) -> Step:
    """Finish an edit: commit the re-authorized arguments bound to the editor's decision, or
    end the call with the typed reason the edit failed for."""
    state, call, statement = edit.state, edit.state.authorized, edit.statement
    assert call is not None
    sub = statement.approver.sub
    if isinstance(reauthorized, tuple):
        code, status = reauthorized
        error = ErrorInfo.of(code)
        emits, ended = _ended_all(state, call, status, error, now)
        return Step(
            state=_terminal(
                state,
                Phase.DENIED,
                now,
                rules,
                decided_by=sub,
                ended_status=status,
                ended_error=error,
            ),
            emits=emits,
            ended=ended,
            audits=(
                _audit(
                    AuditKind.APPROVAL_EDIT_REFUSED,
                    call,
                    call.call_id,
                    code=code.value,
                    approver=sub,
                ),
            ),
        )
    return _approved(
        state,
        reauthorized,
        statement,
        approvers=(sub,),
        decision_ids=state.decision_ids,
        now=now,
        rules=rules,
        audits=(
            _audit(
                AuditKind.APPROVAL_EDIT_COMMITTED,
                reauthorized,
                call.call_id,
                approver=sub,
                original_fingerprint=call.fingerprint,
            ),
        ),
        authorized=reauthorized,
    )


def on_tick(state: ApprovalState | None, *, now: datetime, rules: Rules) -> Step:
    """The timer's nudge: expire a request nobody decided in time; drop decisions whose own
    hold time passed without their request; forget terminal states whose time is up."""
    if state is None:
        return Step(state=None)
    if state.phase is Phase.PENDING and state.expires_at and now >= state.expires_at:
        call = state.authorized
        assert call is not None
        error = ErrorInfo.of(ErrorCode.APPROVAL_EXPIRED)
        emits, ended = _ended_all(state, call, Status.EXPIRED, error, now)
        return Step(
            state=_terminal(
                state, Phase.EXPIRED, now, rules, ended_status=Status.EXPIRED, ended_error=error
            ),
            emits=emits,
            ended=ended,
            audits=(
                _audit(
                    AuditKind.APPROVAL_EXPIRED,
                    call,
                    call.call_id,
                    expires_at=state.expires_at.isoformat(),
                ),
            ),
        )
    if state.phase is Phase.HELD and state.held_until and now >= state.held_until:
        # Calls that came to join a request that never arrived (or was forgotten) open
        # their own.
        return Step(
            state=None,
            emits=tuple(_on_its_own(f) for f in state.followers),
            audits=tuple(
                AuditEntry(
                    kind=AuditKind.APPROVAL_DECISION_DROPPED,
                    tenant=None,
                    call_id=state.call_id,
                    detail={"decision_id": d.decision_id, "reason": "request never arrived"},
                )
                for d in state.held
            ),
        )
    if state.phase in TERMINAL_PHASES and state.forget_at is not None and now >= state.forget_at:
        return Step(state=None)  # deleted: a tombstone on the changelog
    return Step(state=state)


TERMINAL_PHASES = frozenset({Phase.COMMITTED, Phase.REJECTED, Phase.EXPIRED, Phase.DENIED})


def due(state: ApprovalState, now: datetime) -> bool:
    """Whether the timer should nudge this state."""
    if state.phase is Phase.PENDING:
        return state.expires_at is not None and now >= state.expires_at
    if state.phase is Phase.HELD:
        return state.held_until is not None and now >= state.held_until
    return state.forget_at is not None and now >= state.forget_at


def _statement_detail(
    decision: ApprovalDecision, statement: DecisionStatement | None, reason: str
) -> dict[str, Any]:
    """An audit's view of a decision: identities and ids, never the signed statement (it is
    no credential, but the audit needs none of it)."""
    detail: dict[str, Any] = {
        "decision_id": decision.decision_id,
        "decision_call_id": decision.call_id,
        "reason": reason,
    }
    if statement is not None:
        detail.update(
            decision=statement.decision.value,
            decision_kind=statement.kind.value,
            approver=statement.approver.sub,
            approver_tenant=statement.approver.tenant,
            decision_fingerprint=statement.fingerprint,
            decided_at=statement.issued_at.isoformat(),
        )
    return detail


def _refused(
    call: AuthorizedCall | None,
    call_id: str,
    decision: ApprovalDecision,
    statement: DecisionStatement | None,
    refusal: DecisionRefusal,
) -> AuditEntry:
    return _audit(
        AuditKind.APPROVAL_DECISION_REFUSED,
        call,
        call_id,
        **_statement_detail(decision, statement, refusal.value),
        refusal=refusal.value,
    )


def decision_dead_letter(
    raw: bytes | None, *, reason: str, key: str | None, source: SourcePosition, at: datetime
) -> Emit:
    """A dead letter for an unusable `approvals.decided` record: its digest and size only.
    Unlike other dead letters it keeps no prefix: an old (v1) decision carried the approver's
    bearer token, which must not be copied to another topic."""
    return dead_letter(
        raw, reason=reason, call_id=None, key=key, source=source, at=at, keep_prefix=False
    )


def commits(step: Step) -> bool:
    """Whether ``step`` commits a command (or goes on to commit an edit)."""
    return step.edit is not None or any(e.topic is Topic.COMMITTED for e in step.emits)


def frozen_instead(
    state: ApprovalState, step: Step, freeze: FreezeRecord, *, now: datetime, rules: Rules
) -> Step:
    """The kill switch at the join: a step that would commit a call in a frozen scope ends
    the call `frozen` instead (denied; nothing is committed). The decision's own audit stays,
    followed by why it did not count."""
    call = state.authorized
    assert call is not None
    return Step(
        state=_terminal(state, Phase.DENIED, now, rules),
        emits=(_ended(call, Status.DENIED, ErrorCode.FROZEN, now),),
        audits=(
            *step.audits,
            _audit(
                AuditKind.APPROVAL_FROZEN,
                call,
                call.call_id,
                scope=freeze.scope,
                frozen_by=freeze.by,
                frozen_reason=freeze.reason,
            ),
        ),
    )
