"""Pure decisions of the executor: dedup against the ledger, approval receipts, outcome
status per error code."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from approvals.signing import ApprovalKeys, DecisionRefusal, receipt_refusal
from commands.catalog import Tool
from commands.policy import APPROVAL_EFFECTS
from schemas.envelopes import CommittedCommand, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint

TERMINAL_LEDGER_STATUSES = frozenset(
    {s.value for s in Status} - {Status.AWAITING_APPROVAL.value, Status.UNKNOWN.value}
)


class Dedup(StrEnum):
    REPLAY = "replay"  # same key, same fingerprint, finished: return the stored outcome
    CONFLICT = "conflict"  # same key, different fingerprint
    IN_FLIGHT = "in_flight"  # same key, same fingerprint, not finished: never re-run blindly


def dedup_decision(*, stored_fingerprint: str, stored_status: str, fingerprint: str) -> Dedup:
    if stored_fingerprint != fingerprint:
        return Dedup.CONFLICT
    if stored_status in TERMINAL_LEDGER_STATUSES:
        return Dedup.REPLAY
    return Dedup.IN_FLIGHT


def receipt_problem(
    command: CommittedCommand, tool: Tool, now: datetime, keys: ApprovalKeys
) -> ErrorCode | None:
    """Why this command may not run as committed, or None. Checks the fingerprint against the
    arguments being executed and, for effects that need one, the approval receipt: signed by
    the approval service for this call, tenant, fingerprint and policy version, unexpired
    (the same verification as the approval-join's, `approvals.signing.receipt_refusal`)."""
    expected = fingerprint(
        tenant=command.tenant,
        tool=command.tool,
        arguments=command.arguments,
        policy_version=command.policy_version,
    )
    if expected != command.fingerprint:
        return ErrorCode.PRECONDITION_FAILED
    if tool.effect not in APPROVAL_EFFECTS:
        return None
    refusal = receipt_refusal(
        command.approval,
        call_id=command.call_id,
        tenant=command.tenant,
        fingerprint=command.fingerprint,
        policy_version=command.policy_version,
        keys=keys,
        now=now,
    )
    if refusal is DecisionRefusal.REQUEST_EXPIRED:
        return ErrorCode.APPROVAL_EXPIRED
    return ErrorCode.PRECONDITION_FAILED if refusal is not None else None


STATUS_BY_CODE: dict[ErrorCode, Status] = {
    ErrorCode.CONFLICT: Status.CONFLICT,
    ErrorCode.APPROVAL_EXPIRED: Status.EXPIRED,
    ErrorCode.CANCELLED: Status.CANCELLED,
    ErrorCode.TIMEOUT: Status.UNKNOWN,
}


def status_for(code: ErrorCode) -> Status:
    return STATUS_BY_CODE.get(code, Status.FAILED)
