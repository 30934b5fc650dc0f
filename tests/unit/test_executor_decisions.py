from __future__ import annotations

from datetime import timedelta

from commands.catalog import Catalog
from executors.decisions import Dedup, dedup_decision, receipt_problem, status_for
from schemas.envelopes import ActorRef, ApprovalReceipt, CommittedCommand, Effect, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from tests.unit.conftest import NOW

ARGS = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"}
FP = fingerprint(tenant="tenant-a", tool="propose_refund", arguments=ARGS, policy_version="p1")


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
        approval=ApprovalReceipt(
            approver="boss", decided_at=NOW, expires_at=NOW + timedelta(minutes=5), fingerprint=FP
        ),
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
    assert receipt_problem(command(), tool, NOW) is None
    assert receipt_problem(command(approval=None), tool, NOW) is ErrorCode.PRECONDITION_FAILED
    tampered = command(arguments={**ARGS, "amount_minor": 999})
    assert receipt_problem(tampered, tool, NOW) is ErrorCode.PRECONDITION_FAILED
    assert receipt_problem(command(), tool, NOW + timedelta(hours=1)) is ErrorCode.APPROVAL_EXPIRED


def test_status_per_code() -> None:
    assert status_for(ErrorCode.CONFLICT) is Status.CONFLICT
    assert status_for(ErrorCode.TIMEOUT) is Status.UNKNOWN
    assert status_for(ErrorCode.NOT_FOUND) is Status.FAILED
