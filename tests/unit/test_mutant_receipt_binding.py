"""A receipt approves the exact arguments it was signed for (issue 43, `make mutants`): a
command whose arguments and fingerprint agree, for the same call, tenant and policy version,
but whose receipt was signed over another fingerprint, does not run.

test_executor_decisions.py's tampered command changes the arguments under the approved
fingerprint, which the fingerprint check refuses first; this one passes that check, so only
the receipt's own binding can refuse it."""

from __future__ import annotations

from datetime import timedelta

from approvals.signing import DecisionRefusal, receipt_refusal, sign_receipt
from commands.catalog import Catalog
from executors.decisions import receipt_problem
from schemas.envelopes import ApprovalReceipt
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from tests.unit.conftest import NOW, SIGNING
from tests.unit.test_executor_decisions import ARGS, FP, command

BIGGER = {**ARGS, "amount_minor": 999_999}
BIGGER_FP = fingerprint(
    tenant="tenant-a", tool="propose_refund", arguments=BIGGER, policy_version="p1"
)


def receipt_for(fp: str) -> ApprovalReceipt:
    return sign_receipt(
        ApprovalReceipt(
            approver="boss",
            decided_at=NOW,
            expires_at=NOW + timedelta(minutes=5),
            fingerprint=fp,
            call_id="c",
            tenant="tenant-a",
            policy_version="p1",
            approvers=("boss",),
            decision_ids=("d-1",),
            basis="approver",
        ),
        SIGNING,
    )


def test_a_receipt_for_other_arguments_is_a_fingerprint_mismatch() -> None:
    refusal = receipt_refusal(
        receipt_for(FP),
        call_id="c",
        tenant="tenant-a",
        fingerprint=BIGGER_FP,
        policy_version="p1",
        keys=SIGNING,
        now=NOW,
    )
    assert refusal is DecisionRefusal.FINGERPRINT_MISMATCH


def test_a_consistent_command_under_a_receipt_for_other_arguments_does_not_run(
    catalog: Catalog,
) -> None:
    tool = catalog.get("propose_refund")
    assert tool is not None
    approved_small = command(arguments=BIGGER, fingerprint=BIGGER_FP, approval=receipt_for(FP))
    assert receipt_problem(approved_small, tool, NOW, SIGNING) is ErrorCode.PRECONDITION_FAILED
    # The same command under a receipt for its own arguments runs.
    own = command(arguments=BIGGER, fingerprint=BIGGER_FP, approval=receipt_for(BIGGER_FP))
    assert receipt_problem(own, tool, NOW, SIGNING) is None
