"""The approval-join's pure state machine with signed decisions, without brokers."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from jwt.algorithms import OKPAlgorithm

from approvals.signing import (
    ApproverKey,
    DecisionRefusal,
    VerifiedDecision,
    local_signing_key,
    receipt_refusal,
    sign_decision,
    statement_for,
    verify_decision,
)
from commands.catalog import Catalog
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    ApprovalReceipt,
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
    Rules,
    Step,
    due,
    edited,
    on_authorized,
    on_decided,
    on_tick,
)
from tests.unit.conftest import NOW, SIGNING
from testsupport.records import authorized_refund, signed_approval

ARGS = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "charged twice"}
HOLD = timedelta(seconds=60)
RULES = Rules(keys=SIGNING, hold=HOLD, retention=timedelta(minutes=5))
BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))
BOSS2 = Actor(sub="boss-2", tenant="tenant-a", roles=("approver",))


def authorized(
    call_id: str = "c-1",
    arguments: dict[str, Any] | None = None,
    effect: Effect = Effect.EXTERNAL_WRITE,
    **kw: Any,
) -> AuthorizedCall:
    return authorized_refund(call_id, arguments or ARGS, now=NOW, effect=effect, **kw)


def assert_receipt_valid(receipt: ApprovalReceipt, call: AuthorizedCall) -> None:
    """The executor's commit-time check accepts ``receipt`` for ``call``."""
    refusal = receipt_refusal(
        receipt,
        call_id=call.call_id,
        tenant=call.tenant,
        fingerprint=call.fingerprint,
        policy_version=call.policy_version,
        keys=SIGNING,
        now=NOW,
    )
    assert refusal is None


def decision(
    call: AuthorizedCall,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    approver: Actor = BOSS,
    **kw: Any,
) -> ApprovalDecision:
    """A decision signed by the approval service for ``approver`` about ``call``."""
    body: dict[str, Any] = {
        "call_id": call.call_id,
        "tenant": call.tenant,
        "fingerprint": call.fingerprint,
        "approver": approver,
        "verdict": verdict,
        "now": NOW,
        "validity": timedelta(minutes=15),
    }
    body.update(kw)
    return sign_decision(statement_for(**body), SIGNING)


def pending(catalog: Catalog, call: AuthorizedCall | None = None) -> ApprovalState:
    call = call or authorized()
    step = on_authorized(None, call, tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    assert step.state is not None
    return step.state


def decide(
    catalog: Catalog,
    state: ApprovalState | None,
    d: ApprovalDecision,
    minutes: int = 1,
    key: str | None = None,
) -> Step:
    now = NOW + timedelta(minutes=minutes)
    call_id = key or d.call_id
    verified = verify_decision(d, kafka_key=call_id, keys=SIGNING, now=now)
    return on_decided(
        state,
        d,
        verified,
        call_id=call_id,
        tool=catalog.get("propose_refund"),
        now=now,
        rules=RULES,
    )


def refusal(step: Step) -> str:
    (audit,) = step.audits
    assert audit.kind == "approval_decision_refused"
    return str(audit.detail["refusal"])


def committed(step: Step) -> list[CommittedCommand]:
    return [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]


def test_request_then_valid_approval_commits_once_with_signed_receipt(catalog: Catalog) -> None:
    call = authorized()
    state = pending(catalog, call)
    assert state.phase is Phase.PENDING
    assert state.expires_at == NOW + timedelta(minutes=15)
    d = decision(call)
    step = decide(catalog, state, d)
    (command,) = committed(step)
    receipt = command.approval
    assert receipt is not None
    assert (receipt.approver, receipt.fingerprint, receipt.call_id) == (
        "boss",
        call.fingerprint,
        call.call_id,
    )
    assert receipt.decision_ids == (d.decision_id,)
    assert receipt.expires_at == state.expires_at
    assert_receipt_valid(receipt, call)
    assert step.state is not None and step.state.phase is Phase.COMMITTED
    # The same decision replayed, and a second approval, both commit nothing.
    again = decide(catalog, step.state, d)
    assert committed(again) == []
    assert refusal(again) == "decision_reused"
    other = decide(catalog, step.state, decision(call, approver=BOSS2))
    assert committed(other) == []
    assert refusal(other) == "not_pending"


def test_the_audit_holds_no_credential(catalog: Catalog) -> None:
    call = authorized()
    step = decide(catalog, pending(catalog, call), decision(call))
    text = json.dumps([a.detail for a in step.audits])
    assert "eyJ" not in text


@pytest.mark.parametrize(
    ("approver", "change", "minutes", "reason"),
    [
        (
            Actor(sub="boss", tenant="tenant-b", roles=("approver",)),
            {},
            1,
            "approver_not_permitted",
        ),
        (
            Actor(sub="clerk", tenant="tenant-a", roles=("support",)),
            {},
            1,
            "approver_not_permitted",
        ),
        (Actor(sub="agent-1", tenant="tenant-a", roles=("approver",)), {}, 1, "self_approval"),
        (BOSS, {"fingerprint": "f" * 64}, 1, "fingerprint_mismatch"),
        (BOSS, {"tenant": "tenant-b"}, 1, "tenant_mismatch"),
        (BOSS, {"validity": timedelta(hours=1)}, 16, "request_expired"),
        (BOSS, {}, 17, "statement_expired"),
        (BOSS, {"now": NOW + timedelta(minutes=5)}, 1, "statement_expired"),
    ],
    ids=[
        "other-tenant",
        "no-role",
        "self-approval",
        "other-fingerprint",
        "other-tenant-signed",
        "request-expired",
        "statement-expired",
        "issued-in-the-future",
    ],
)
def test_refused_decisions_change_nothing(
    catalog: Catalog, approver: Actor, change: dict[str, Any], minutes: int, reason: str
) -> None:
    call = authorized()
    state = pending(catalog, call)
    step = decide(catalog, state, decision(call, approver=approver, **change), minutes=minutes)
    assert step.state == state
    assert step.emits == ()
    assert refusal(step) == reason


def test_a_decision_readdressed_to_another_call_approves_nothing(catalog: Catalog) -> None:
    a, b = authorized("c-a"), authorized("c-b")
    assert a.fingerprint == b.fingerprint  # same arguments: the old attack's precondition
    state_b = pending(catalog, b)
    for_a = decision(a)
    # (a) the body's call id rewritten to B
    rewritten = for_a.model_copy(update={"call_id": "c-b"})
    step = decide(catalog, state_b, rewritten, key="c-b")
    assert (step.state, step.emits, refusal(step)) == (state_b, (), "body_mismatch")
    # (b) A's unchanged bytes under Kafka key B
    step = decide(catalog, state_b, for_a, key="c-b")
    assert (step.state, step.emits, refusal(step)) == (state_b, (), "key_mismatch")
    assert step.audits[0].call_id == "c-b"
    # A statement signed for A reaching B's state by any other way: call mismatch.
    verified = verify_decision(for_a, kafka_key="c-a", keys=SIGNING, now=NOW)
    assert isinstance(verified, VerifiedDecision)
    step = on_decided(
        state_b,
        for_a,
        verified,
        call_id="c-b",
        tool=catalog.get("propose_refund"),
        now=NOW,
        rules=RULES,
    )
    assert (step.state, step.emits, refusal(step)) == (state_b, (), "call_mismatch")


def _tampered(d: ApprovalDecision, **claims: Any) -> ApprovalDecision:
    header, payload, signature = d.statement.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(claims)
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return d.model_copy(update={"statement": f"{header}.{forged}.{signature}"})


def test_bad_signatures_and_unknown_keys_are_refused(catalog: Catalog) -> None:
    call = authorized()
    state = pending(catalog, call)
    d = decision(call)
    assert (
        refusal(decide(catalog, state, _tampered(d, approver={"sub": "x", "tenant": "tenant-a"})))
        == "bad_signature"
    )
    assert refusal(decide(catalog, state, d.model_copy(update={"statement": "garbage"}))) == (
        "bad_signature"
    )
    stranger = replace(SIGNING, signing_key=local_signing_key("someone else's seed, long enough"))
    forged = signed_approval(call, stranger, approver=BOSS, now=NOW, validity=timedelta(minutes=5))
    assert refusal(decide(catalog, state, forged)) == "bad_signature"
    unknown = signed_approval(
        call,
        stranger,
        approver=BOSS,
        now=NOW,
        validity=timedelta(minutes=5),
        key=stranger.signing_key,
        kid="rotated-out",
    )
    assert refusal(decide(catalog, state, unknown)) == "unknown_key"


def test_an_approver_signs_with_their_own_key(catalog: Catalog) -> None:
    own = ed25519.Ed25519PrivateKey.generate()
    public = json.loads(OKPAlgorithm.to_jwk(own.public_key()))
    assert "d" not in public
    keys = replace(
        SIGNING,
        approver_keys={
            "boss-key": ApproverKey(
                key=own.public_key(),
                algorithm="EdDSA",
                sub="boss",
                tenant="tenant-a",
                roles=("approver",),
            )
        },
    )
    call = authorized()
    statement = statement_for(
        call_id=call.call_id,
        tenant=call.tenant,
        fingerprint=call.fingerprint,
        approver=Actor(sub="boss", tenant="tenant-a", roles=("approver", "admin")),
        verdict=ApprovalVerdict.APPROVE,
        now=NOW,
        validity=timedelta(minutes=5),
    )
    d = sign_decision(statement, keys, key=own, kid="boss-key")
    verified = verify_decision(d, kafka_key=call.call_id, keys=keys, now=NOW)
    assert isinstance(verified, VerifiedDecision)
    assert verified.signer == "boss-key"
    assert verified.statement.approver.roles == ("approver",)  # the key's roles, not claimed
    impostor = statement.model_copy(
        update={"approver": statement.approver.model_copy(update={"sub": "boss-2"})}
    )
    bad = sign_decision(impostor, keys, key=own, kid="boss-key")
    assert verify_decision(bad, kafka_key=call.call_id, keys=keys, now=NOW) is (
        DecisionRefusal.SIGNER_MISMATCH
    )


def test_a_v1_decision_with_a_bearer_token_is_not_a_decision() -> None:
    old = {
        "v": 1,
        "call_id": "c-1",
        "fingerprint": "a" * 64,
        "decision": "approve",
        "approver": "eyJhbGciOiJIUzI1NiJ9.e30.x",
        "decided_at": NOW.isoformat(),
    }
    with pytest.raises(ValueError, match="validation error"):
        ApprovalDecision.model_validate(old)


def test_four_eyes_needs_two_distinct_approvers(catalog: Catalog) -> None:
    call = authorized(effect=Effect.DESTRUCTIVE)
    state = pending(catalog, call)
    assert state.required_approvals == 2
    first = decide(catalog, state, decision(call))
    assert committed(first) == []
    assert first.state is not None and first.state.approvals == ("boss",)
    same = decide(catalog, first.state, decision(call))
    assert committed(same) == []
    assert refusal(same) == "same_approver"
    second = decide(catalog, first.state, decision(call, approver=BOSS2))
    (command,) = committed(second)
    assert command.approval is not None
    assert command.approval.approvers == ("boss", "boss-2")


def test_auto_approval_receipt_names_the_policy(catalog: Catalog) -> None:
    call = authorized(route=Route.AUTO, auto_approved_by="refund-small-auto")
    step = on_authorized(None, call, tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    (command,) = committed(step)
    receipt = command.approval
    assert receipt is not None
    assert (receipt.basis, receipt.auto_policy, receipt.approver) == (
        "auto",
        "refund-small-auto",
        "policy:refund-small-auto",
    )
    assert_receipt_valid(receipt, call)
    assert [a.kind for a in step.audits] == ["approval_auto"]
    plain = authorized(route=Route.AUTO)
    (unreceipted,) = committed(
        on_authorized(None, plain, tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    )
    assert unreceipted.approval is None


def test_reject(catalog: Catalog) -> None:
    call = authorized()
    step = decide(catalog, pending(catalog, call), decision(call, ApprovalVerdict.REJECT))
    (o,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert (o.status, o.error and o.error.code.value) == (Status.REJECTED, "approval_rejected")
    assert step.state is not None and step.state.forget_at is not None


def test_the_approvers_reason_reaches_the_outcome(catalog: Catalog) -> None:
    call = authorized()
    rejected = decision(call, ApprovalVerdict.REJECT, reason="the order was never shipped")
    step = decide(catalog, pending(catalog, call), rejected)
    (o,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert o.error is not None
    assert o.error.reason is not None and o.error.reason.value == "approver"
    assert "the order was never shipped" in o.error.message


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
    done = edited(step.edit, reauthorized, now=NOW, rules=RULES)
    (command,) = committed(done)
    assert command.arguments == edit_args
    assert command.approval is not None
    assert command.approval.fingerprint == reauthorized.fingerprint == command.fingerprint
    refused = edited(step.edit, (ErrorCode.POLICY_DENIED, Status.DENIED), now=NOW, rules=RULES)
    assert committed(refused) == []
    assert refused.state is not None and refused.state.phase is Phase.DENIED


def test_decision_before_request_is_held_then_replayed(catalog: Catalog) -> None:
    call = authorized()
    early = decide(catalog, None, decision(call))
    assert early.state is not None and early.state.phase is Phase.HELD
    assert committed(early) == []
    step = on_authorized(
        early.state, call, tool=catalog.get("propose_refund"), now=NOW, rules=RULES
    )
    assert step.replay == early.state.held
    assert [e.topic for e in step.emits] == [Topic.APPROVALS_REQUESTED, Topic.OUTCOMES]


def test_held_decision_dropped_after_its_own_ttl(catalog: Catalog) -> None:
    call = authorized()
    early = decide(catalog, None, decision(call), minutes=0)
    assert early.state is not None
    assert not due(early.state, NOW)
    later = NOW + HOLD
    assert due(early.state, later)
    step = on_tick(early.state, now=later, rules=RULES)
    assert step.state is None
    assert [a.kind for a in step.audits] == ["approval_decision_dropped"]


def test_expiry_tick_then_the_terminal_state_is_forgotten(catalog: Catalog) -> None:
    state = pending(catalog)
    assert on_tick(state, now=NOW + timedelta(minutes=14), rules=RULES).state == state
    assert state.expires_at is not None
    step = on_tick(state, now=state.expires_at, rules=RULES)
    assert step.state is not None and step.state.phase is Phase.EXPIRED
    (o,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert (o.status, o.error and o.error.code.value) == (Status.EXPIRED, "approval_expired")
    assert on_tick(step.state, now=state.expires_at, rules=RULES).emits == ()
    forget_at = step.state.forget_at
    # Kept for the request's TTL + clock skew + the retention margin, then deleted.
    assert forget_at == state.expires_at + timedelta(seconds=30) + timedelta(minutes=5)
    assert not due(step.state, forget_at - timedelta(seconds=1))
    assert due(step.state, forget_at)
    assert on_tick(step.state, now=forget_at, rules=RULES).state is None


def test_redelivered_request_does_not_reopen(catalog: Catalog) -> None:
    call = authorized()
    state = pending(catalog, call)
    done = decide(catalog, state, decision(call)).state
    again = on_authorized(done, call, tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    assert again.state == done
    assert again.emits == ()


def test_states_written_before_signed_decisions_never_crash_the_join(catalog: Catalog) -> None:
    from streams.join_decisions import readable_state

    state = pending(catalog)
    old = json.loads(state.model_dump_json())
    for field in ("approvals", "decision_ids", "required_approvals", "forget_at"):
        old.pop(field)  # a v1 pending state
    assert readable_state(json.dumps(old).encode()) == state
    held_v1 = {**old, "phase": "held", "held": [{"v": 1, "approver": "eyJ.x.y"}]}
    assert readable_state(json.dumps(held_v1).encode()) is None
    assert readable_state(b"\x00garbage") is None
    assert readable_state(None) is None
