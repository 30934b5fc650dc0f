"""The executor's outcomes and audit details, built the same way by every path that ends a
command (the ledger path in `executors.executor`, the batched reads in `executors.reads`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from executors.decisions import status_for
from schemas.envelopes import CommittedCommand, ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode, RatifierError, RefusalReason


def outcome_of(
    command: CommittedCommand,
    *,
    status: Status,
    code: ErrorCode | None = None,
    result: dict[str, Any] | None = None,
    resource_id: str | None = None,
    trace_id: str | None,
    stage: Stage = Stage.EXECUTE,
    error: ErrorInfo | None = None,
) -> Outcome:
    return Outcome.for_command(
        command,
        status=status,
        stage=stage,
        code=code,
        error=error,
        result=result,
        resource_id=resource_id,
        at=datetime.now(UTC),
        trace_id=trace_id,
    )


def failed_outcome(command: CommittedCommand, code: ErrorCode, trace_id: str | None) -> Outcome:
    return outcome_of(command, status=status_for(code), code=code, trace_id=trace_id)


def unavailable_outcome(
    command: CommittedCommand, retry_after: float | None, trace_id: str | None
) -> Outcome:
    """Refused before any effect: the downstream's circuit breaker is open. Nothing of the
    call is recorded as executed; the same call may be retried after ``retry_after``."""
    code = ErrorCode.UNAVAILABLE
    wait = round(retry_after, 3) if retry_after is not None else None
    error = ErrorInfo.of(code, retry_after=wait)
    return outcome_of(command, status=status_for(code), code=code, trace_id=trace_id, error=error)


def refused_outcome(command: CommittedCommand, exc: RatifierError, trace_id: str | None) -> Outcome:
    """A handler's or effect's failure: only a message it marked safe for the model
    (``for_model``) reaches the outcome, never the exception's own text."""
    error = ErrorInfo.of(exc.code, exc.model_message, reason=RefusalReason.HANDLER)
    return outcome_of(
        command, status=status_for(exc.code), code=exc.code, trace_id=trace_id, error=error
    )


def executed_detail(command: CommittedCommand, outcome: Outcome) -> dict[str, Any]:
    """The audit row's detail for a command the executor ended."""
    return {
        "operation_id": command.operation_id,
        "tool": command.tool,
        "status": outcome.status.value,
        "code": outcome.error.code.value if outcome.error else None,
        "policy_version": command.policy_version,
        "approver": command.approval.approver if command.approval else None,
        "approval_basis": command.approval.basis if command.approval else None,
        "auto_policy": command.approval.auto_policy if command.approval else None,
    }
