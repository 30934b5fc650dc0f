from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from approvals.signing import local_signing_key, sign_receipt
from commands.catalog import Catalog
from executors.decisions import Dedup, dedup_decision, receipt_problem, status_for
from schemas.envelopes import ActorRef, ApprovalReceipt, CommittedCommand, Effect, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from tests.unit.conftest import NOW, SIGNING

ARGS = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"}
FP = fingerprint(tenant="tenant-a", tool="propose_refund", arguments=ARGS, policy_version="p1")


RECEIPT = sign_receipt(
    ApprovalReceipt(
        approver="boss",
        decided_at=NOW,
        expires_at=NOW + timedelta(minutes=5),
        fingerprint=FP,
        call_id="c",
        tenant="tenant-a",
        policy_version="p1",
        approvers=("boss",),
        decision_ids=("d-1",),
        basis="approver",
    ),
    SIGNING,
)


def command(**kw: object) -> CommittedCommand:
    body: dict[str, object] = dict(
        operation_id="tenant-a:k",
        call_id="c",
        tenant="tenant-a",
        actor=ActorRef(sub="u", roles=("refund",)),
        tool="propose_refund",
        arguments=ARGS,
        fingerprint=FP,
        effect=Effect.EXTERNAL_WRITE,
        policy_version="p1",
        committed_at=NOW,
        approval=RECEIPT,
    )
    body.update(kw)
    return CommittedCommand.model_validate(body)


def test_dedup_decisions() -> None:
    assert (
        dedup_decision(stored_fingerprint="a", stored_status="succeeded", fingerprint="a")
        is Dedup.REPLAY
    )
    assert (
        dedup_decision(stored_fingerprint="a", stored_status="succeeded", fingerprint="b")
        is Dedup.CONFLICT
    )
    assert (
        dedup_decision(stored_fingerprint="a", stored_status="running", fingerprint="a")
        is Dedup.IN_FLIGHT
    )


def test_receipt_checks(catalog: Catalog) -> None:
    tool = catalog.get("propose_refund")
    assert tool is not None

    def problem(c: CommittedCommand, now: datetime = NOW) -> ErrorCode | None:
        return receipt_problem(c, tool, now, SIGNING)

    assert problem(command()) is None
    assert problem(command(approval=None)) is ErrorCode.PRECONDITION_FAILED
    tampered = command(arguments={**ARGS, "amount_minor": 999})
    assert problem(tampered) is ErrorCode.PRECONDITION_FAILED
    assert problem(command(), NOW + timedelta(hours=1)) is ErrorCode.APPROVAL_EXPIRED
    # Unsigned, re-addressed, edited or foreign-signed receipts approve nothing.
    unsigned = RECEIPT.model_copy(update={"signature": None})
    assert problem(command(approval=unsigned)) is ErrorCode.PRECONDITION_FAILED
    other_call = command(call_id="c-other")
    assert problem(other_call) is ErrorCode.PRECONDITION_FAILED
    edited = RECEIPT.model_copy(update={"approver": "mallory"})
    assert problem(command(approval=edited)) is ErrorCode.PRECONDITION_FAILED
    forged = sign_receipt(
        RECEIPT,
        replace(SIGNING, signing_key=local_signing_key("an attacker's own seed, long enough")),
    )
    assert problem(command(approval=forged)) is ErrorCode.PRECONDITION_FAILED
    new_policy = fingerprint(
        tenant="tenant-a", tool="propose_refund", arguments=ARGS, policy_version="p2"
    )
    assert (
        problem(command(policy_version="p2", fingerprint=new_policy))
        is ErrorCode.PRECONDITION_FAILED
    )


def test_status_per_code() -> None:
    assert status_for(ErrorCode.CONFLICT) is Status.CONFLICT
    assert status_for(ErrorCode.TIMEOUT) is Status.UNKNOWN
    assert status_for(ErrorCode.NOT_FOUND) is Status.FAILED
