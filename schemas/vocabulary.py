"""Values one package writes and another reads back: the kinds of the stages' own audit rows,
the command ledger's status and the stream stages a worker runs. Their values are stored in
PostgreSQL (`audit_log.kind`, `command_ledger.status`) and named in settings and metrics, so
they never change; a new member is additive."""

from __future__ import annotations

from enum import StrEnum

from schemas.envelopes import Stage, Status


class AuditKind(StrEnum):
    """`audit_log.kind`: what a stage recorded about a call (read back by audit/story.py and
    dashboard/shaping.py)."""

    # the approval stage (streams/approval.py)
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECISION = "approval_decision"
    # written by older versions only; still shown
    APPROVAL_DECISION_INVALID = "approval_decision_invalid"
    APPROVAL_DECISION_REFUSED = "approval_decision_refused"
    APPROVAL_AUTO = "approval_auto"
    APPROVAL_DECISION_HELD = "approval_decision_held"
    APPROVAL_DECISION_DROPPED = "approval_decision_dropped"
    APPROVAL_EDIT_COMMITTED = "approval_edit_committed"
    APPROVAL_EDIT_REFUSED = "approval_edit_refused"
    APPROVAL_EXPIRED = "approval_expired"
    # v1.5: an approval (or the join's commit) of a call in a frozen scope, refused
    APPROVAL_FROZEN = "approval_frozen"
    APPROVAL_JOINED = "approval_joined"  # v1.5: a repeat of an operation joined its request
    # the executor
    EXECUTED = "executed"
    READ = "read"  # a read, run without a ledger entry (docs/execution.md, "Reads")
    LATE_RESULT = "late_result"
    # the reconciler
    RECONCILED = "reconciled"
    ESCALATED = "escalated"
    RESOLVED_BY_HUMAN = "resolved_by_human"


class LedgerStatus(StrEnum):
    """`command_ledger.status`: where an operation stands. Besides the two of its own
    (claimed and running, effect started), a ledger entry holds its outcome's `Status`."""

    RUNNING = "running"
    EFFECT_PENDING = "effect_pending"
    UNKNOWN = Status.UNKNOWN.value
    SUCCEEDED = Status.SUCCEEDED.value
    FAILED = Status.FAILED.value
    REJECTED = Status.REJECTED.value
    DENIED = Status.DENIED.value
    EXPIRED = Status.EXPIRED.value
    CONFLICT = Status.CONFLICT.value
    CANCELLED = Status.CANCELLED.value
    AWAITING_APPROVAL = Status.AWAITING_APPROVAL.value


class StreamStage(StrEnum):
    """The stream stages a streams worker runs (`settings.streams.stages`), deployable and
    scalable apart (the approval-join runs as `ratifier approval-join`)."""

    VALIDATOR = "validator"
    AUTHORIZER = "authorizer"
    APPROVAL_JOIN = "approval-join"

    @property
    def stage(self) -> Stage:
        """The `Stage` its outcomes, metrics and spans carry."""
        return _OUTCOME_STAGE[self]


_OUTCOME_STAGE = {
    StreamStage.VALIDATOR: Stage.VALIDATE,
    StreamStage.AUTHORIZER: Stage.AUTHORIZE,
    StreamStage.APPROVAL_JOIN: Stage.APPROVE,
}
