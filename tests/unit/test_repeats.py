"""Repeats of an operation that needs a human (issue 25, item 2): what the authorizer decides
for a key whose operation is final / pending / unknown / conflicting, and what the
approval-join does with a call that joins a request, redelivered or not. Pure, no brokers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from approvals.signing import receipt_refusal
from commands.catalog import Catalog
from schemas.envelopes import (
    ApprovalRequest,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
    ErrorInfo,
    Outcome,
    Stage,
    Status,
)
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.approval import ApprovalState, Phase, Step, on_authorized, on_tick
from streams.authorizer import repeat_routed
from streams.repeats import OperationSeen, RepeatKind, repeat_decision
from tests.unit.conftest import NOW, SIGNING
from tests.unit.test_approval import ARGS, RULES, authorized, decide, decision, pending

KEY = "refund-key-1"
OTHER_ARGS = {**ARGS, "amount_minor": 1}


def call(call_id: str, arguments: dict[str, Any] | None = None, **kw: Any) -> AuthorizedCall:
    """A call of the operation ``tenant-a:refund-key-1``."""
    return authorized(call_id, arguments, **kw).model_copy(
        update={"idempotency_key": KEY, "operation_id": f"tenant-a:{KEY}"}
    )


def stored_outcome(first: AuthorizedCall) -> dict[str, Any]:
    return Outcome(
        call_id=first.call_id,
        tool=first.tool,
        tenant=first.tenant,
        status=Status.SUCCEEDED,
        stage=Stage.EXECUTE,
        result={"refund_id": "re_1"},
        operation_id=first.operation_id,
        at=NOW,
    ).model_dump(mode="json")


def final(first: AuthorizedCall, status: str = "succeeded") -> OperationSeen:
    return OperationSeen(
        request_call_id=first.call_id,
        request_fingerprint=first.fingerprint,
        ledger_call_id=first.call_id,
        ledger_fingerprint=first.fingerprint,
        ledger_status=status,
        ledger_outcome=stored_outcome(first),
    )


def outcomes(step_or_emits: Step | tuple[Any, ...]) -> list[Outcome]:
    emits = step_or_emits.emits if isinstance(step_or_emits, Step) else step_or_emits
    return [e.value for e in emits if isinstance(e.value, Outcome)]


def requests(step: Step) -> list[ApprovalRequest]:
    return [e.value for e in step.emits if isinstance(e.value, ApprovalRequest)]


def commands(step: Step) -> list[CommittedCommand]:
    return [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]


# -- the authorizer's decision ----------------------------------------------------------------


def test_a_final_operation_is_answered_its_stored_outcome_without_a_request() -> None:
    first, again = call("c-1"), call("c-2", reply_to={"topic": "ratifier.replies.a"})
    assert repeat_decision(again, final(first)).kind is RepeatKind.REPLAY
    emits = repeat_routed(again, final(first), now=NOW)
    (answer,) = outcomes(emits)
    assert [e.topic for e in emits] == [Topic.OUTCOMES]  # no calls.authorized: no request
    assert (answer.call_id, answer.repeats, answer.status) == ("c-2", "c-1", Status.SUCCEEDED)
    assert answer.result == {"refund_id": "re_1"}
    assert answer.reply_to is not None and answer.reply_to.topic == "ratifier.replies.a"
    # Redelivered: the ledger's final entry does not change, nor does the answer.
    assert repeat_routed(again, final(first), now=NOW + timedelta(hours=1)) == emits


def test_a_final_failure_is_final_too_but_an_unknown_one_is_not() -> None:
    first, again = call("c-1"), call("c-2")
    assert repeat_decision(again, final(first, "failed")).kind is RepeatKind.REPLAY
    for unsettled in ("running", "effect_pending", "unknown"):
        seen = final(first, unsettled)
        assert repeat_decision(again, seen).kind is RepeatKind.JOIN, unsettled


def test_a_final_operation_with_other_arguments_is_a_conflict() -> None:
    first, other = call("c-1"), call("c-2", OTHER_ARGS)
    assert repeat_decision(other, final(first)).kind is RepeatKind.CONFLICT
    (answer,) = outcomes(repeat_routed(other, final(first), now=NOW))
    assert answer.status is Status.CONFLICT
    assert answer.error is not None and answer.error.code is ErrorCode.CONFLICT


def test_a_pending_request_is_joined_keyed_by_its_call_id() -> None:
    first, again = call("c-1"), call("c-2")
    seen = OperationSeen(request_call_id="c-1", request_fingerprint=first.fingerprint)
    repeat = repeat_decision(again, seen)
    assert (repeat.kind, repeat.joins) == (RepeatKind.JOIN, "c-1")
    (emit,) = repeat_routed(again, seen, now=NOW)
    assert emit.topic is Topic.AUTHORIZED and emit.key == "c-1"
    assert isinstance(emit.value, AuthorizedCall)
    assert (emit.value.call_id, emit.value.joins) == ("c-2", "c-1")


def test_unknown_own_and_conflicting_pending_keys_open_their_own_request() -> None:
    first = call("c-1")
    # Unknown: the call registered itself, so the row names it.
    own = OperationSeen(request_call_id="c-1", request_fingerprint=first.fingerprint)
    assert repeat_decision(first, own).kind is RepeatKind.OWN_REQUEST
    assert repeat_decision(first, OperationSeen()).kind is RepeatKind.OWN_REQUEST
    (emit,) = repeat_routed(first, own, now=NOW)
    assert (emit.topic, emit.key) == (Topic.AUTHORIZED, "c-1")
    # Other arguments while pending: as before, its own request (the executor's ledger
    # answers its command `conflict` should both be approved).
    other = call("c-2", OTHER_ARGS)
    assert repeat_decision(other, own).kind is RepeatKind.OWN_REQUEST


def test_a_request_that_ended_unrun_is_final_for_its_operation() -> None:
    """Rejected (or expired): a later call of the step is told the same end, also when it is
    a redelivery of a call that had joined the request (no second request, no contradiction);
    the first call's own redelivery goes to the join, which knows it ended."""
    first, again = call("c-1"), call("c-2")
    rejected = Outcome.model_validate(stored_outcome(first)).model_copy(
        update={"status": Status.REJECTED, "result": None, "stage": Stage.APPROVE}
    )
    seen = OperationSeen(
        request_call_id="c-1",
        request_fingerprint=first.fingerprint,
        request_outcome=rejected.model_dump(mode="json"),
    )
    (answer,) = outcomes(repeat_routed(again, seen, now=NOW))
    assert (answer.call_id, answer.status, answer.repeats) == ("c-2", Status.REJECTED, "c-1")
    assert repeat_decision(first, seen).kind is RepeatKind.OWN_REQUEST
    other = call("c-3", OTHER_ARGS)
    assert repeat_decision(other, seen).kind is RepeatKind.CONFLICT


# -- the approval-join ------------------------------------------------------------------------


def joining(call_id: str = "c-2") -> AuthorizedCall:
    return call(call_id, joins="c-1")


def test_a_joining_call_waits_with_the_pending_request_and_adds_none(catalog: Catalog) -> None:
    first = call("c-1")
    state = pending(catalog, first)
    step = on_authorized(state, joining(), tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    assert requests(step) == []
    (waiting,) = outcomes(step)
    assert (waiting.call_id, waiting.status, waiting.repeats) == (
        "c-2",
        Status.AWAITING_APPROVAL,
        "c-1",
    )
    assert step.state is not None and [f.call_id for f in step.state.followers] == ["c-2"]
    # Redelivered: nothing new.
    again = on_authorized(
        step.state, joining(), tool=catalog.get("propose_refund"), now=NOW, rules=RULES
    )
    assert again.emits == () and again.state == step.state


def test_one_approval_commits_the_operation_then_each_follower(catalog: Catalog) -> None:
    first = call("c-1")
    state = on_authorized(pending(catalog, first), joining(), tool=None, now=NOW, rules=RULES).state
    step = decide(catalog, state, decision(first))
    leader, follower = commands(step)
    assert (leader.call_id, follower.call_id) == ("c-1", "c-2")
    assert leader.operation_id == follower.operation_id == f"tenant-a:{KEY}"
    assert leader.fingerprint == follower.fingerprint
    # The follower's receipt is the executor's to accept for the follower's call.
    assert follower.approval is not None
    refusal = receipt_refusal(
        follower.approval,
        call_id="c-2",
        tenant="tenant-a",
        fingerprint=first.fingerprint,
        policy_version="p1",
        keys=SIGNING,
        now=NOW,
    )
    assert refusal is None
    assert step.ended == ()  # the operation runs: the ledger will hold its outcome


def test_a_rejection_ends_every_joined_call_and_releases_the_operation(catalog: Catalog) -> None:
    first = call("c-1")
    state = on_authorized(pending(catalog, first), joining(), tool=None, now=NOW, rules=RULES).state
    step = decide(catalog, state, decision(first, ApprovalVerdict.REJECT, reason="no"))
    ended = {o.call_id: (o.status, o.repeats) for o in outcomes(step)}
    assert ended == {"c-1": (Status.REJECTED, None), "c-2": (Status.REJECTED, "c-1")}
    assert commands(step) == []
    ((request_end),) = step.ended
    assert request_end.call.call_id == "c-1" and request_end.outcome.status is Status.REJECTED
    # A call joining after the end is told the same end, and nothing is committed.
    late = on_authorized(step.state, joining("c-3"), tool=None, now=NOW, rules=RULES)
    (told,) = outcomes(late)
    assert (told.call_id, told.status, told.repeats) == ("c-3", Status.REJECTED, "c-1")
    assert told.error is not None and told.error.code is ErrorCode.APPROVAL_REJECTED


def test_expiry_ends_every_joined_call(catalog: Catalog) -> None:
    first = call("c-1")
    state = on_authorized(pending(catalog, first), joining(), tool=None, now=NOW, rules=RULES).state
    step = on_tick(state, now=NOW + timedelta(hours=1), rules=RULES)
    assert {o.call_id: o.status for o in outcomes(step)} == {
        "c-1": Status.EXPIRED,
        "c-2": Status.EXPIRED,
    }
    assert [(e.call.call_id, e.outcome.status) for e in step.ended] == [("c-1", Status.EXPIRED)]


def test_a_call_joining_after_the_commit_is_committed_to_meet_the_ledger(
    catalog: Catalog,
) -> None:
    first = call("c-1")
    committed = decide(catalog, pending(catalog, first), decision(first)).state
    assert committed is not None and committed.phase is Phase.COMMITTED
    step = on_authorized(committed, joining(), tool=None, now=NOW, rules=RULES)
    (command,) = commands(step)
    assert (command.call_id, command.operation_id) == ("c-2", f"tenant-a:{KEY}")
    assert outcomes(step) == []  # the executor answers it from its ledger
    again = on_authorized(step.state, joining(), tool=None, now=NOW, rules=RULES)
    assert again.emits == ()


def test_a_call_joining_before_its_request_is_held_then_answered(catalog: Catalog) -> None:
    first = call("c-1")
    held = on_authorized(None, joining(), tool=None, now=NOW, rules=RULES)
    assert held.emits == ()
    assert held.state is not None and held.state.phase is Phase.HELD
    opened = on_authorized(
        held.state, first, tool=catalog.get("propose_refund"), now=NOW, rules=RULES
    )
    assert len(requests(opened)) == 1
    assert {o.call_id: o.repeats for o in outcomes(opened)} == {"c-1": None, "c-2": "c-1"}


def test_a_call_whose_request_never_comes_opens_its_own(catalog: Catalog) -> None:
    held = on_authorized(None, joining(), tool=None, now=NOW, rules=RULES).state
    step = on_tick(held, now=NOW + timedelta(hours=1), rules=RULES)
    (emit,) = step.emits
    assert (emit.topic, emit.key) == (Topic.AUTHORIZED, "c-2")
    assert isinstance(emit.value, AuthorizedCall) and emit.value.joins is None
    reopened = on_authorized(
        None, emit.value, tool=catalog.get("propose_refund"), now=NOW, rules=RULES
    )
    assert [r.call_id for r in requests(reopened)] == ["c-2"]


def test_a_call_joining_a_request_rejected_before_v1_5_is_told_rejected() -> None:
    first = call("c-1")
    old = ApprovalState(call_id="c-1", phase=Phase.REJECTED, authorized=first)
    (told,) = outcomes(on_authorized(old, joining(), tool=None, now=NOW, rules=RULES))
    assert (told.status, told.error and told.error.code) == (
        Status.REJECTED,
        ErrorCode.APPROVAL_REJECTED,
    )


def test_states_without_followers_still_read() -> None:
    """A state written before v1.5 (no followers, no end) reads with the defaults."""
    old = ApprovalState(call_id="c-1", phase=Phase.REJECTED).model_dump_json(
        exclude={"followers", "ended_status", "ended_error"}
    )
    state = ApprovalState.model_validate_json(old)
    assert state.followers == () and state.ended_error is None
    assert ErrorInfo.of(ErrorCode.CONFLICT).code is ErrorCode.CONFLICT
