"""What a stage decides to publish: pure values, sent by the app at the edge."""

from __future__ import annotations

from datetime import datetime

from runtime.emit import Emit, dead_letter
from schemas.envelopes import ErrorInfo, FieldProblem, Outcome, ReplyAddress, Stage, Status
from schemas.errors import ErrorCode
from schemas.names import Topic

__all__ = ["Emit", "dead_letter", "outcome"]


def outcome(
    *,
    call_id: str,
    tool: str,
    tenant: str | None,
    status: Status,
    stage: Stage,
    code: ErrorCode | None,
    at: datetime,
    fields: tuple[FieldProblem, ...] = (),
    policy_version: str | None = None,
    operation_id: str | None = None,
    trace_id: str | None = None,
    error: ErrorInfo | None = None,
    reply_to: ReplyAddress | None = None,
    repeats: str | None = None,
) -> Emit:
    """An `outcomes` record for a call that ends (or waits) in a stream stage; ``error``,
    when given, replaces the generic one of ``code`` (reasons, policies, a safe message)."""
    return Emit(
        topic=Topic.OUTCOMES,
        key=call_id,
        value=Outcome.for_call(
            call_id=call_id,
            tool=tool,
            tenant=tenant,
            status=status,
            stage=stage,
            code=code,
            fields=fields,
            error=error,
            operation_id=operation_id,
            policy_version=policy_version,
            at=at,
            trace_id=trace_id,
            reply_to=reply_to,
            repeats=repeats,
        ),
    )
