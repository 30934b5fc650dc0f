"""The reconciler's domain, pure: when an unknown operation is checked again, which calls are
owed its settled outcome and how each is addressed, what a settled outcome says, how owed
outcomes are published (executors/reconciler.py runs it; executors/reconciler_store.py keeps
its state)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from commands.catalog import HandlerResult
from runtime.emit import Emit
from runtime.loop import Handled
from schemas.envelopes import ErrorInfo, Outcome, ReplyAddress, Stage, Status
from schemas.errors import (
    ErrorCode,
)
from schemas.names import Topic
from telemetry.tracing import TraceParent, new_trace_id

LAST_CHECK_MAX_CHARS = 300


def backoff_seconds(attempt: int, base: float, cap: float = 300.0) -> float:
    """Exponential, capped (five minutes unless configured otherwise)."""
    return float(min(base * 2**attempt, cap))


@dataclass(frozen=True, kw_only=True)
class WaitingCall:
    """A call answered `unknown` for an operation, owed its settled outcome."""

    call_id: str
    trace_id: str | None
    reply_to: ReplyAddress | None = None  # v1.3: its settled outcome is copied there too


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What reconciliation concluded for one operation."""

    outcome: Outcome | None  # None: not settled yet (check again later, or escalated)
    escalated: bool = False
    # The outcomes owed to every waiting call (written to the outbox), the first one's first.
    owed: tuple[Outcome, ...] = ()


def waiting_calls(row: dict[str, Any], recorded: Sequence[WaitingCall]) -> list[WaitingCall]:
    """Every call owed the operation's settled outcome, each once: the call that started it
    (the ledger entry's), then those recorded as answered `unknown`. The entry's own call
    keeps the trace of its unknown outcome when that outcome was its own."""
    unknown = row.get("outcome") or {}
    own = unknown.get("call_id") == row["call_id"]
    calls: dict[str, WaitingCall] = {
        row["call_id"]: WaitingCall(
            call_id=row["call_id"],
            trace_id=unknown.get("trace_id") if own else None,
            reply_to=reply_address(unknown.get("reply_to")) if own else None,
        )
    }
    for call in recorded:
        known = calls.get(call.call_id)
        if known is None or (known.trace_id is None and call.trace_id is not None):
            calls[call.call_id] = call
        elif known.reply_to is None and call.reply_to is not None:
            calls[call.call_id] = WaitingCall(
                call_id=known.call_id, trace_id=known.trace_id, reply_to=call.reply_to
            )
    return list(calls.values())


def readdressed(outcome: Outcome, calls: Sequence[WaitingCall]) -> list[Outcome]:
    """The one settled outcome, once per waiting call, in that call's own trace, to that
    call's own reply address."""
    return [
        outcome.model_copy(
            update={
                "call_id": call.call_id,
                "trace_id": call.trace_id or outcome.trace_id,
                "reply_to": call.reply_to,
            }
        )
        for call in calls
    ]


def reply_address(raw: Any) -> ReplyAddress | None:
    """A reply address as recorded (JSON), None when absent or unreadable."""
    if raw is None:
        return None
    try:
        return ReplyAddress.model_validate(raw)
    except ValidationError:
        return None


def describe_failure(exc: BaseException) -> str:
    """The last check's result as `ratifier ops unknown` shows it."""
    text = f"cannot tell: {type(exc).__name__}: {exc}".strip().rstrip(":")
    return text[:LAST_CHECK_MAX_CHARS]


def settled_outcome(
    row: dict[str, Any],
    status: Status,
    *,
    code: ErrorCode | None = None,
    done: HandlerResult | None = None,
) -> Outcome:
    unknown = row.get("outcome") or {}
    return Outcome(
        call_id=row["call_id"],
        tool=row["tool"],
        tenant=row["tenant"],
        status=status,
        stage=Stage.RECONCILE,
        error=ErrorInfo.of(code) if code is not None else None,
        result=done.result if done else None,
        resource_id=done.resource_id if done else None,
        operation_id=row["operation_id"],
        # The version the command was authorized under, as recorded with its unknown outcome.
        policy_version=unknown.get("policy_version"),
        at=datetime.now(UTC),
        # The call's trace, as recorded with its unknown outcome.
        trace_id=unknown.get("trace_id") or new_trace_id(),
        reply_to=reply_address(unknown.get("reply_to")),
    )


def publications(outcomes: Sequence[Outcome], parents: dict[str, TraceParent]) -> list[Handled]:
    """Owed outcomes as the loop publishes them, each its own hop in its call's trace.
    ``parents`` (operation id to the executor's hop, from `commands.unknown`) links a span to
    the executor's when it is in the same trace (another waiting call's trace is not)."""
    handled = []
    for outcome in outcomes:
        parent = parents.get(outcome.operation_id or "")
        handled.append(
            Handled(
                emits=(Emit(topic=Topic.OUTCOMES, key=outcome.call_id, value=outcome),),
                call_id=outcome.call_id,
                tool=outcome.tool,
                tenant=outcome.tenant,
                trace_id=outcome.trace_id,
                parent=parent
                if parent is not None and parent.trace_id == outcome.trace_id
                else None,
            )
        )
    for outcome in outcomes:
        parents.pop(outcome.operation_id or "", None)
    return handled
