"""The demo's texts say what happened (issue 42): a refund staff approved is not described as
waiting for the customer's confirmation, and a receipt names the path it records (staff
approval, the customer's confirmation; docs/approvals.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dashboard import shaping
from ratifier.demo import _detail
from schemas.envelopes import ApprovalReceipt, ErrorInfo, Outcome, Stage, Status
from schemas.errors import AWAITING_CONFIRMATION_MESSAGE, ErrorCode

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def _feed(status: str, record: dict[str, Any]) -> dict[str, Any]:
    return shaping.feed_item(
        {
            "stream": "outcomes",
            "kafka_partition": 0,
            "kafka_offset": 1,
            "record_at": NOW,
            "call_id": "demo-1-6",
            "tenant": "tenant-a",
            "tool": "propose_refund",
            "status": status,
            "error_code": (record.get("error") or {}).get("code"),
            "record": record,
        }
    )


def test_the_feed_names_both_ways_a_confirmable_request_can_end() -> None:
    waiting = _feed(
        "awaiting_approval",
        {"error": {"code": "approval_required", "message": AWAITING_CONFIRMATION_MESSAGE}},
    )
    assert waiting["message"] == (
        "Waits for the customer's confirmation or an approver's decision."
    )
    # Other waiting texts and refusals are shown as the pipeline wrote them.
    staff_only = _feed(
        "awaiting_approval",
        {"error": {"code": "approval_required", "message": "A human must approve this action."}},
    )
    assert staff_only["message"] == "A human must approve this action."
    approved = _feed("succeeded", {"approval": {"approver": "demo-approver"}})
    assert (approved["message"], approved["approver"]) == (None, "demo-approver")


def _outcome(basis: str | None, approver: str) -> Outcome:
    receipt = ApprovalReceipt(
        approver=approver,
        decided_at=NOW,
        expires_at=NOW + timedelta(minutes=5),
        fingerprint="f" * 64,
        basis=basis,
    )
    return Outcome(
        call_id="demo-1-6",
        tenant="tenant-a",
        tool="propose_refund",
        status=Status.SUCCEEDED,
        stage=Stage.EXECUTE,
        at=NOW,
        approval=receipt,
    )


def test_the_demo_table_names_who_let_the_refund_run() -> None:
    assert _detail(_outcome("approver", "demo-approver")) == "approved by demo-approver"
    assert _detail(_outcome(None, "demo-approver")) == "approved by demo-approver"
    assert _detail(_outcome("confirmation", "alice@example.com")) == (
        "confirmed by alice@example.com (the customer)"
    )
    waiting = Outcome(
        call_id="demo-1-7",
        tenant="tenant-a",
        tool="propose_refund",
        status=Status.AWAITING_APPROVAL,
        stage=Stage.APPROVE,
        at=NOW,
        error=ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, AWAITING_CONFIRMATION_MESSAGE),
    )
    assert _detail(waiting) == "waiting in the approval inbox"
