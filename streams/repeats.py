"""Repeats of an operation that needs a human approval: what the authorizer does with a call
whose operation (tenant + idempotency key) was proposed before. Pure.

Two facts in PostgreSQL decide it, read after the call registered itself as the operation's
approval request (insert-if-absent, `approval_requests`): the command ledger's entry (the
executor's record of whether the operation ran, and its final outcome) and the request row
(which call holds the operation's request, and its end when it ended without running). In
this order:

- the ledger has a final outcome: same fingerprint → that outcome, re-addressed to this call
  and naming the call it repeats (no approval request); another fingerprint → `conflict`;
- the request ended without running (rejected, expired, a refused edit): the same, with that
  end (the holder's own redelivery goes on to the join, which knows the end);
- another call holds the operation's request with the same fingerprint → this call joins it:
  its `calls.authorized` record is keyed by that call id, so the approval-join answers both;
- otherwise (the first call, its own redelivery, or another fingerprint whose command will
  meet the ledger's `conflict` as before) → its own request, as before.

Exact under redelivery: both final records are written once and never change, so a
redelivered call is answered the same outcome again; the request row names one call for good,
so a redelivered follower is keyed by the same call id again (or told the end the join told
it), and the join, which keeps its followers, adds nothing twice (streams/approval.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from schemas.envelopes import AuthorizedCall, ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode

# Ledger statuses that are an operation's last word (the executor's terminal ones).
FINAL_LEDGER_STATUSES = frozenset(
    {s.value for s in Status} - {Status.AWAITING_APPROVAL.value, Status.UNKNOWN.value}
)


@dataclass(frozen=True, kw_only=True)
class OperationSeen:
    """What PostgreSQL knows about a call's operation (after the call registered)."""

    request_call_id: str | None = None
    request_fingerprint: str | None = None
    # The request ended without its command running (rejected, expired, a refused edit).
    request_outcome: dict[str, Any] | None = None
    ledger_call_id: str | None = None
    ledger_fingerprint: str | None = None
    ledger_status: str | None = None
    ledger_outcome: dict[str, Any] | None = None


class RepeatKind(StrEnum):
    OWN_REQUEST = "own_request"  # first of its operation (or not a repeat we can join)
    REPLAY = "replay"  # the operation ended: its stored outcome
    CONFLICT = "conflict"  # the operation ended with other arguments
    JOIN = "join"  # the operation's request is pending: join it


@dataclass(frozen=True, kw_only=True)
class Repeat:
    kind: RepeatKind
    stored: Outcome | None = None  # REPLAY: the operation's outcome
    joins: str | None = None  # JOIN: the call id holding the request


def repeat_decision(call: AuthorizedCall, seen: OperationSeen) -> Repeat:
    """What to do with ``call`` (routed to a human approval) given ``seen``."""
    if seen.ledger_status in FINAL_LEDGER_STATUSES and seen.ledger_outcome is not None:
        if seen.ledger_fingerprint != call.fingerprint:
            return Repeat(kind=RepeatKind.CONFLICT)
        return Repeat(kind=RepeatKind.REPLAY, stored=Outcome.model_validate(seen.ledger_outcome))
    if seen.request_outcome is not None:  # final too: the request's end
        if seen.request_fingerprint != call.fingerprint:
            return Repeat(kind=RepeatKind.CONFLICT)
        if seen.request_call_id == call.call_id:
            return Repeat(kind=RepeatKind.OWN_REQUEST)  # its own, redelivered: the join knows
        return Repeat(kind=RepeatKind.REPLAY, stored=Outcome.model_validate(seen.request_outcome))
    if (
        seen.request_call_id is not None
        and seen.request_call_id != call.call_id
        and seen.request_fingerprint == call.fingerprint
    ):
        return Repeat(kind=RepeatKind.JOIN, joins=seen.request_call_id)
    return Repeat(kind=RepeatKind.OWN_REQUEST)


def replayed(stored: Outcome, call: AuthorizedCall) -> Outcome:
    """The operation's stored outcome, answered to ``call`` and naming the call it repeats."""
    return stored.model_copy(
        update={
            "call_id": call.call_id,
            "reply_to": call.reply_to,
            "trace_id": call.trace_id,
            "repeats": stored.repeats or stored.call_id,
        }
    )


def conflicted(call: AuthorizedCall, *, now: datetime) -> Outcome:
    """The `conflict` outcome of a call whose key names an operation that ended with other
    arguments (or under another policy version: the fingerprint covers both)."""
    return Outcome(
        call_id=call.call_id,
        tool=call.tool,
        tenant=call.tenant,
        status=Status.CONFLICT,
        stage=Stage.AUTHORIZE,
        error=ErrorInfo.of(ErrorCode.CONFLICT),
        operation_id=call.operation_id,
        policy_version=call.policy_version,
        at=now,
        trace_id=call.trace_id,
        reply_to=call.reply_to,
    )


# The operations of a batch's approval-routed calls, in order: each call registered as its
# operation's request if none was, then read (streams/storage.py).
OperationsSeen = Callable[[Sequence[AuthorizedCall]], Awaitable[Sequence[OperationSeen]]]
