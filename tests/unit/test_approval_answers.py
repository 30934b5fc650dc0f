"""Approver surfaces answer honestly: a decision is checked before it is published with the
rule the approval-join decides with, and the join's audit is turned into the status the
approver follows. Pure: no Kafka, no PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from approvals.inbox import decision_body, statement_of
from approvals.policy import PolicyRights
from approvals.refusals import error_json
from approvals.rights import ApproverRights, RoleRights
from approvals.signing import DecisionRefusal, sign_decision, verify_decision
from approvals.verdicts import DecisionStatus, approved_by, check_decision, verdict_from
from commands.catalog import Catalog
from schemas.envelopes import Actor, ApprovalRequest, ApprovalVerdict, Effect
from schemas.errors import ErrorCode, InvalidArguments, RatifierError
from streams.approval import Rules, on_authorized, on_decided
from tests.unit.conftest import NOW, SIGNING
from testsupport.records import authorized_refund

ARGS = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "charged twice"}
RULES = Rules(keys=SIGNING)
BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))
REQUESTER = Actor(sub="agent-1", tenant="tenant-a", roles=("approver",))
RIGHTS: tuple[ApproverRights, ...] = (RoleRights(), PolicyRights.from_directory())


def opened(catalog: Catalog, effect: Effect = Effect.EXTERNAL_WRITE) -> ApprovalRequest:
    """The request the join publishes for a refund (by agent-1)."""
    call = authorized_refund("c-1", ARGS, now=NOW, effect=effect)
    step = on_authorized(None, call, tool=catalog.get("propose_refund"), now=NOW, rules=RULES)
    (request,) = [e.value for e in step.emits if isinstance(e.value, ApprovalRequest)]
    return request


def refused(
    catalog: Catalog,
    request: ApprovalRequest,
    approver: Actor,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    *,
    rights: ApproverRights,
    rows: list[dict[str, Any]] | None = None,
    arguments: dict[str, Any] | None = None,
) -> RatifierError | None:
    statement = statement_of(
        request, approver=approver, keys=SIGNING, verdict=verdict, arguments=arguments, now=NOW
    )
    try:
        check_decision(statement, request, catalog=catalog, rights=rights, rows=rows or [])
    except RatifierError as exc:
        return exc
    return None


@pytest.mark.parametrize("rights", RIGHTS, ids=["role", "cedar"])
def test_self_approval_and_arguments_are_refused_before_publishing(
    catalog: Catalog, rights: ApproverRights
) -> None:
    request = opened(catalog)
    own = refused(catalog, request, REQUESTER, rights=rights)
    assert own is not None and error_json(own)["error"] == {
        "code": "policy_denied",
        "message": own.safe_message,
        "refusal": "self_approval",
    }
    extra = refused(catalog, request, BOSS, rights=rights, arguments={"amount_minor": 1})
    assert extra is not None and extra.code is ErrorCode.INVALID_ARGUMENTS
    assert error_json(extra)["error"]["refusal"] == "arguments_without_edit"
    assert refused(catalog, request, BOSS, rights=rights) is None
    assert refused(catalog, request, BOSS, ApprovalVerdict.REJECT, rights=rights) is None


def test_the_same_approver_twice_is_a_conflict_from_the_joins_audit(catalog: Catalog) -> None:
    request = opened(catalog, Effect.DESTRUCTIVE)
    assert request.required_approvals == 2
    counted = [
        {"kind": "approval_decision", "detail": {"decision": "approve", "approver": "boss"}},
        {"kind": "approval_decision_refused", "detail": {"decision": "approve", "approver": "x"}},
    ]
    assert approved_by(counted) == ("boss",)
    again = refused(catalog, request, BOSS, rights=RoleRights(), rows=counted)
    assert again is not None and again.code is ErrorCode.CONFLICT
    assert error_json(again)["error"]["refusal"] == "same_approver"
    other = Actor(sub="boss-2", tenant="tenant-a", roles=("approver",))
    assert refused(catalog, request, other, rights=RoleRights(), rows=counted) is None


def test_the_join_refuses_an_approve_that_carries_arguments(catalog: Catalog) -> None:
    """A decision signed elsewhere (CLI, an approver's own key) with arguments on an approve
    is refused by the join too: the arguments would be silently ignored."""
    call = authorized_refund("c-1", ARGS, now=NOW)
    tool = catalog.get("propose_refund")
    state = on_authorized(None, call, tool=tool, now=NOW, rules=RULES).state
    request = opened(catalog)
    statement = statement_of(
        request,
        approver=BOSS,
        keys=SIGNING,
        verdict=ApprovalVerdict.APPROVE,
        arguments={"amount_minor": 1},
        now=NOW,
    )
    decision = sign_decision(statement, SIGNING)
    now = NOW + timedelta(seconds=1)
    verified = verify_decision(decision, kafka_key="c-1", keys=SIGNING, now=now)
    step = on_decided(state, decision, verified, call_id="c-1", tool=tool, now=now, rules=RULES)
    assert step.emits == ()
    (audit,) = step.audits
    assert audit.detail["refusal"] == DecisionRefusal.ARGUMENTS_WITHOUT_EDIT.value


def test_decision_bodies_carry_arguments_only_on_an_edit() -> None:
    assert decision_body({"decision": "approve"}) == (ApprovalVerdict.APPROVE, None, None)
    assert decision_body({"decision": "edit", "arguments": {"a": 1}, "reason": "r"}) == (
        ApprovalVerdict.EDIT,
        "r",
        {"a": 1},
    )
    bad: Any
    for bad in (
        {"decision": "approve", "arguments": {"a": 1}},
        {"decision": "reject", "arguments": {}},
        {"decision": "edit"},
        {"decision": "maybe"},
        {"decision": "approve", "reason": 3},
        [],
    ):
        with pytest.raises(InvalidArguments):
            decision_body(bad)
    confirm = frozenset({ApprovalVerdict.APPROVE, ApprovalVerdict.REJECT})
    with pytest.raises(InvalidArguments, match="approve or reject"):
        decision_body({"decision": "edit", "arguments": {"a": 1}}, allowed=confirm)


def row(kind: str, decision_id: str, **detail: Any) -> dict[str, Any]:
    return {"kind": kind, "detail": {"decision_id": decision_id, **detail}}


def test_the_joins_audit_becomes_the_status_the_approver_follows() -> None:
    def status(rows: list[dict[str, Any]], outcome: str | None = None) -> Any:
        return verdict_from(rows, call_id="c-1", decision_id="d-1", outcome=outcome)

    assert status([]).status is DecisionStatus.PUBLISHED
    assert status([row("approval_decision", "d-other")]).status is DecisionStatus.PUBLISHED
    assert status([row("approval_decision_held", "d-1")]).status is DecisionStatus.HELD
    first = row("approval_decision", "d-1", approvals=1, required_approvals=2)
    waiting = status([first])
    assert (waiting.status, waiting.approvals, waiting.required_approvals) == (
        DecisionStatus.WAITING,
        1,
        2,
    )
    assert waiting.to_json()["status"] == "waiting_for_another_approver"
    # Once the call ended, the counted approval took part in deciding it.
    assert status([first], "succeeded").status is DecisionStatus.APPLIED
    assert status([row("approval_decision", "d-1")], "awaiting_approval").outcome is None
    done = status([row("approval_decision", "d-1")], "succeeded")
    assert (done.status, done.outcome) == (DecisionStatus.APPLIED, "succeeded")
    no = status([row("approval_decision_refused", "d-1", refusal="self_approval")])
    assert no.status is DecisionStatus.REFUSED
    assert no.to_json()["error"]["refusal"] == "self_approval"
    assert no.to_json()["error"]["code"] == "policy_denied"
    # A redelivered decision refused as reused does not undo the one the join counted.
    replayed = [row("approval_decision", "d-1"), row("approval_decision_refused", "d-1")]
    assert status(replayed).status is DecisionStatus.APPLIED
    odd = status([row("approval_decision_refused", "d-1", refusal="no-such-thing")])
    assert odd.refusal is DecisionRefusal.MALFORMED
