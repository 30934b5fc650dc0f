"""The approval-join's pure state machine: the seed 001 matrix without brokers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from commands.catalog import Catalog
from schemas.envelopes import (
    Actor,
    ActorRef,
    ApprovalDecision,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
    Effect,
    Outcome,
    Route,
    Status,
)
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from schemas.names import Topic
from streams.approval import (
    ApprovalState,
    Phase,
    Step,
    due,
    edited,
    on_authorized,
    on_decided,
    on_tick,
)
from tests.unit.conftest import NOW

ARGS = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "charged twice"}
HOLD = timedelta(seconds=60)
BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))


def authorized(call_id: str = "c-1", arguments: dict[str, Any] | None = None) -> AuthorizedCall:
    args = arguments or ARGS
    return AuthorizedCall(
        call_id=call_id,
        operation_id=f"tenant-a:{call_id}",
        idempotency_key=call_id,
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=("refund",)),
        tool="propose_refund",
        arguments=args,
        fingerprint=fingerprint(
            tenant="tenant-a", tool="propose_refund", arguments=args, policy_version="p1"
        ),
        effect=Effect.EXTERNAL_WRITE,
        policy_version="p1",
        route=Route.APPROVAL,
        proposed_at=NOW,
        authorized_at=NOW,
    )


def decision(
    call: AuthorizedCall, verdict: ApprovalVerdict = ApprovalVerdict.APPROVE, **kw: Any
) -> ApprovalDecision:
    body: dict[str, Any] = {
        "call_id": call.call_id,
        "fingerprint": call.fingerprint,
        "decision": verdict,
        "approver": "signed-token",
        "decided_at": NOW,
    }
    body.update(kw)
    return ApprovalDecision.model_validate(body)


def pending(catalog: Catalog, call: AuthorizedCall | None = None) -> ApprovalState:
    call = call or authorized()
    step = on_authorized(None, call, tool=catalog.get("propose_refund"), now=NOW)
    assert step.state is not None
    return step.state


def decide(
    catalog: Catalog,
    state: ApprovalState | None,
    d: ApprovalDecision,
    approver: Actor | None = BOSS,
    minutes: int = 1,
) -> Step:
    return on_decided(
        state,
        d,
        approver,
        tool=catalog.get("propose_refund"),
        now=NOW + timedelta(minutes=minutes),
        hold=HOLD,
    )


def committed(step: Step) -> list[CommittedCommand]:
    return [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]


def test_request_then_valid_approval_commits_once_with_receipt(catalog: Catalog) -> None:
    call = authorized()
    state = pending(catalog, call)
    assert state.phase is Phase.PENDING
    assert state.expires_at == NOW + timedelta(minutes=15)
    step = decide(catalog, state, decision(call))
    (command,) = committed(step)
    assert command.approval is not None
    assert (command.approval.approver, command.approval.fingerprint) == ("boss", call.fingerprint)
    assert command.approval.expires_at == state.expires_at
    assert step.state is not None and step.state.phase is Phase.COMMITTED
    # Double confirmation: the approval is used.
    again = decide(catalog, step.state, decision(call))
    assert committed(again) == []
    assert again.audits[0].kind == "approval_decision_invalid"
    assert again.audits[0].detail["reason"] == "approval already committed"


@pytest.mark.parametrize(
    ("approver", "change", "minutes", "reason"),
    [
        (None, {}, 1, "approver token does not verify"),
        (
            Actor(sub="boss", tenant="tenant-b", roles=("approver",)),
            {},
            1,
            "approver belongs to another tenant",
        ),
        (
            Actor(sub="clerk", tenant="tenant-a", roles=("support",)),
            {},
            1,
            "approver lacks the approver role",
        ),
        (
            Actor(sub="agent-1", tenant="tenant-a", roles=("approver",)),
            {},
            1,
            "requester cannot approve their own call",
        ),
        (BOSS, {"fingerprint": "f" * 64}, 1, "fingerprint does not match the pending request"),
        (BOSS, {}, 16, "arrived after the request expired"),
        (BOSS, {"decided_at": NOW + timedelta(minutes=20)}, 1, "decided after the request expired"),
    ],
    ids=[
        "unverified",
        "other-tenant",
        "no-role",
        "self-approval",
        "replayed-fingerprint",
        "expired",
        "decided-late",
    ],
)
def test_invalid_decisions_change_nothing(
    catalog: Catalog, approver: Actor | None, change: dict[str, Any], minutes: int, reason: str
) -> None:
    call = authorized()
    state = pending(catalog, call)
    step = decide(catalog, state, decision(call, **change), approver=approver, minutes=minutes)
    assert step.state == state
    assert step.emits == ()
    (audit,) = step.audits
    assert (audit.kind, audit.detail["reason"]) == ("approval_decision_invalid", reason)


def test_changed_amount_voids_the_old_consent(catalog: Catalog) -> None:
    old = authorized("c-old")
    new = authorized("c-new", {**ARGS, "amount_minor": 4000})
    assert old.fingerprint != new.fingerprint
    state = pending(catalog, new)
    step = decide(catalog, state, decision(old, call_id="c-new"))
    assert committed(step) == []
    assert step.state == state


def test_reject(catalog: Catalog) -> None:
    call = authorized()
    step = decide(catalog, pending(catalog, call), decision(call, ApprovalVerdict.REJECT))
    (o,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert (o.status, o.error and o.error.code.value) == (Status.REJECTED, "approval_rejected")


def test_edit_asks_for_reauthorization_then_commits_new_arguments(catalog: Catalog) -> None:
    call = authorized()
    edit_args = {**ARGS, "amount_minor": 2500}
    step = decide(
        catalog, pending(catalog, call), decision(call, ApprovalVerdict.EDIT, arguments=edit_args)
    )
    assert step.edit is not None
    assert step.emits == ()
    reauthorized = call.model_copy(
        update={
            "arguments": edit_args,
            "fingerprint": fingerprint(
                tenant="tenant-a", tool="propose_refund", arguments=edit_args, policy_version="p1"
            ),
        }
    )
    done = edited(step.edit, reauthorized, now=NOW)
    (command,) = committed(done)
    assert command.arguments == edit_args
    assert command.approval is not None
    assert command.approval.fingerprint == reauthorized.fingerprint == command.fingerprint
    refused = edited(step.edit, (ErrorCode.POLICY_DENIED, Status.DENIED), now=NOW)
    assert committed(refused) == []
    assert refused.state is not None and refused.state.phase is Phase.DENIED


def test_decision_before_request_is_held_then_replayed(catalog: Catalog) -> None:
    call = authorized()
    early = decide(catalog, None, decision(call))
    assert early.state is not None and early.state.phase is Phase.HELD
    assert committed(early) == []
    step = on_authorized(early.state, call, tool=catalog.get("propose_refund"), now=NOW)
    assert step.replay == early.state.held
    assert [e.topic for e in step.emits] == [Topic.APPROVALS_REQUESTED, Topic.OUTCOMES]


def test_held_decision_dropped_after_its_own_ttl(catalog: Catalog) -> None:
    call = authorized()
    early = decide(catalog, None, decision(call), minutes=0)
    assert early.state is not None
    assert not due(early.state, NOW)
    later = NOW + HOLD
    assert due(early.state, later)
    step = on_tick(early.state, now=later)
    assert step.state is None
    assert [a.kind for a in step.audits] == ["approval_decision_dropped"]


def test_expiry_tick(catalog: Catalog) -> None:
    state = pending(catalog)
    assert on_tick(state, now=NOW + timedelta(minutes=14)).state == state
    assert state.expires_at is not None
    step = on_tick(state, now=state.expires_at)
    assert step.state is not None and step.state.phase is Phase.EXPIRED
    (o,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert (o.status, o.error and o.error.code.value) == (Status.EXPIRED, "approval_expired")
    assert on_tick(step.state, now=state.expires_at).emits == ()


def test_redelivered_request_does_not_reopen(catalog: Catalog) -> None:
    call = authorized()
    state = pending(catalog, call)
    done = decide(catalog, state, decision(call)).state
    again = on_authorized(done, call, tool=catalog.get("propose_refund"), now=NOW)
    assert again.state == done
    assert again.emits == ()
