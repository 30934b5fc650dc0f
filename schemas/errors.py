"""Error codes of the v1 contract and the exception tree that maps onto them.

One root (`RatifierError`); each subclass means one thing and carries exactly one code.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class ErrorCode(StrEnum):
    MALFORMED = "malformed"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNAUTHENTICATED = "unauthenticated"
    POLICY_DENIED = "policy_denied"
    NOT_FOUND = "not_found"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    CONFLICT = "conflict"
    PRECONDITION_FAILED = "precondition_failed"
    TIMEOUT = "timeout"
    RETRYABLE_ERROR = "retryable_error"
    PERMANENT_ERROR = "permanent_error"
    RETRY_EXHAUSTED = "retry_exhausted"
    CANCELLED = "cancelled"
    # v1.3: `reply_to` names a topic outside the deployment's reply namespace.
    INVALID_REPLY_ADDRESS = "invalid_reply_address"
    # v1.5: an operator froze a scope the call falls in (the kill switch, docs/kill-switch.md).
    FROZEN = "frozen"
    # v1.5: the call would take a spending budget's window over its cap (status `denied`).
    BUDGET_EXCEEDED = "budget_exceeded"
    # v1.5: the downstream's circuit breaker is open; nothing was attempted (docs/execution.md,
    # "Circuit breakers"). Retryable, after `ErrorInfo.retry_after` seconds.
    UNAVAILABLE = "unavailable"
    # v1.5: a rate, concurrency or load limit refused the call at admission; nothing ran and
    # nothing was queued. Retry the same call (same idempotency key) after ``retry_after``.
    RATE_LIMITED = "rate_limited"


class RefusalReason(StrEnum):
    """Why a call was refused, beyond its code (``ErrorInfo.reason``; additive in v1.2)."""

    # A `forbid` policy matched (`ErrorInfo.policies` names it).
    FORBID = "forbid"
    # No `permit` policy matched.
    NO_PERMIT = "no_permit"
    # A policy could not be evaluated (a loader attribute missing, undeclared or of the wrong
    # type, a clash of entity types): denied, fail closed; logged, counted and audited.
    EVALUATION_ERROR = "evaluation_error"
    # The tool's handler refused the call (its message, if any, was marked safe for models).
    HANDLER = "handler"
    # A human approver rejected the call (the message carries their reason, if they gave one).
    APPROVER = "approver"


# Texts that name the customer (the subject a call acts for, who confirms it themselves)
# instead of staff: while a call waits for their confirmation, and when they declined it.
AWAITING_CONFIRMATION_MESSAGE = "This action waits for the customer's confirmation."
CUSTOMER_DECLINED_MESSAGE = "The customer declined this action."

# Whether an agent may retry the same proposal unchanged.
RETRYABLE_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.TIMEOUT,
        ErrorCode.RETRYABLE_ERROR,
        ErrorCode.UNAVAILABLE,
        ErrorCode.RATE_LIMITED,
    }
)

# Short messages that are safe to show a model: no SQL, paths, tokens or tenant data.
SAFE_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.MALFORMED: "The record is not a valid call envelope.",
    ErrorCode.UNKNOWN_TOOL: "No tool with this name exists.",
    ErrorCode.INVALID_ARGUMENTS: "The arguments do not match the tool's schema.",
    ErrorCode.UNAUTHENTICATED: "The call's context could not be verified.",
    ErrorCode.POLICY_DENIED: "Policy does not allow this action.",
    ErrorCode.NOT_FOUND: "The resource was not found.",
    ErrorCode.APPROVAL_REQUIRED: "A human must approve this action.",
    ErrorCode.APPROVAL_REJECTED: "The approver rejected this action.",
    ErrorCode.APPROVAL_EXPIRED: "Nobody approved this action in time.",
    ErrorCode.CONFLICT: "This idempotency key was used for a different call.",
    ErrorCode.PRECONDITION_FAILED: "The resource changed after the call was authorized.",
    ErrorCode.TIMEOUT: "The outcome is not known yet; reconciliation is under way.",
    ErrorCode.RETRYABLE_ERROR: "A transient failure happened before any effect.",
    ErrorCode.PERMANENT_ERROR: "The call cannot succeed with these arguments.",
    ErrorCode.RETRY_EXHAUSTED: (
        "Retries are exhausted (status unknown: escalated to a person, whose answer follows)."
    ),
    ErrorCode.CANCELLED: "The call was cancelled before its effect.",
    ErrorCode.INVALID_REPLY_ADDRESS: "The reply address is not a reply topic of this deployment.",
    ErrorCode.FROZEN: "Operators have paused this kind of action for now; try again later.",
    ErrorCode.BUDGET_EXCEEDED: "A spending budget does not allow this call now.",
    ErrorCode.UNAVAILABLE: (
        "The system this action needs is failing; nothing was attempted. Retry the same call "
        "after retry_after seconds."
    ),
    ErrorCode.RATE_LIMITED: "Too many calls right now; retry the same call after retry_after.",
}


class RatifierError(Exception):
    """Root of every error ratifier raises on purpose."""

    code: ClassVar[ErrorCode] = ErrorCode.PERMANENT_ERROR

    def __init__(self, message: str | None = None, *, for_model: str | None = None) -> None:
        self.safe_message = message or SAFE_MESSAGES[self.code]
        # A message its author marked safe to show the model (no secrets, no other tenant's
        # data); ``message`` is for logs and operators and never reaches an outcome.
        self.model_message = for_model
        super().__init__(self.safe_message)


class InvalidArguments(RatifierError):
    code = ErrorCode.INVALID_ARGUMENTS


class Unauthenticated(RatifierError):
    code = ErrorCode.UNAUTHENTICATED


class PolicyDenied(RatifierError):
    code = ErrorCode.POLICY_DENIED


class ResourceNotFound(RatifierError):
    code = ErrorCode.NOT_FOUND


class ApprovalExpired(RatifierError):
    code = ErrorCode.APPROVAL_EXPIRED


class Frozen(RatifierError):
    """An operator froze a scope the call falls in (the kill switch)."""

    code = ErrorCode.FROZEN


class DownstreamUnavailable(RatifierError):
    """The downstream's circuit breaker is open: the effect was not attempted; the call may
    be retried after ``retry_after`` seconds."""

    code = ErrorCode.UNAVAILABLE

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class PreconditionFailed(RatifierError):
    code = ErrorCode.PRECONDITION_FAILED


class OutcomeUnknown(RatifierError):
    code = ErrorCode.TIMEOUT


class TransientFailure(RatifierError):
    """A failure known to have happened before any effect; safe to retry."""

    code = ErrorCode.RETRYABLE_ERROR


class PermanentFailure(RatifierError):
    code = ErrorCode.PERMANENT_ERROR


class StorageUnavailable(TransientFailure):
    """PostgreSQL, Redis or Kafka could not be reached; nothing was changed."""


class ConfigurationError(RatifierError):
    """Settings, catalog or policies are unusable; raised at start-up only."""

    code = ErrorCode.PERMANENT_ERROR


class MissingKeyMaterial(ConfigurationError):
    """Outside development mode, a key, secret or salt is not configured (the built-in ones
    are public): the service refuses to start."""


class UnknownSetting(ConfigurationError):
    """A ``RATIFIER_*`` environment variable that no setting reads (misspelt or renamed)."""
