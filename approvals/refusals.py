"""Typed refusals of a decision, as the approver surfaces (HTTP API, dashboard) answer them:
each refusal of the approval-join's vocabulary (`approvals.signing.DecisionRefusal`) maps to
one error code of the contract; the body names the refusal too."""

from __future__ import annotations

from typing import Any

from approvals.signing import DecisionRefusal
from schemas.errors import ErrorCode, InvalidArguments, PolicyDenied, RatifierError

# What the approver reads for each refusal (safe: no other party's data).
REFUSAL_TEXT: dict[DecisionRefusal, str] = {
    DecisionRefusal.SELF_APPROVAL: "You requested this call: another approver must decide it.",
    DecisionRefusal.APPROVER_NOT_PERMITTED: "You may not take this decision on this call.",
    DecisionRefusal.SAME_APPROVER: (
        "You already approved this call; it needs the approval of another person."
    ),
    DecisionRefusal.EDIT_WITHOUT_ARGUMENTS: (
        "An edit needs new arguments, and only a call one approver decides can be edited."
    ),
    DecisionRefusal.ARGUMENTS_WITHOUT_EDIT: (
        "Only an edit carries arguments; approve and reject take none."
    ),
    DecisionRefusal.NOT_PENDING: "This call is no longer waiting for a decision.",
    DecisionRefusal.REQUEST_EXPIRED: "This request expired; nobody can decide it any more.",
    DecisionRefusal.FINGERPRINT_MISMATCH: "The call changed after you saw it; look again.",
}
_REFUSED = "The approval service refused this decision."


class DecisionRefused(PolicyDenied):
    """The approver may not take this decision on this call (403)."""

    def __init__(
        self, message: str | None = None, *, refusal: DecisionRefusal | None = None
    ) -> None:
        super().__init__(message)
        self.refusal = refusal


class AlreadyApproved(RatifierError):
    """Four-eyes: this approver's approval already counts; another person must approve (409)."""

    code = ErrorCode.CONFLICT

    def __init__(
        self, message: str | None = None, *, refusal: DecisionRefusal | None = None
    ) -> None:
        super().__init__(message)
        self.refusal = refusal


class ArgumentsWithoutEdit(InvalidArguments):
    """Arguments on an approve or a reject: only an edit carries them (400)."""

    def __init__(
        self, message: str | None = None, *, refusal: DecisionRefusal | None = None
    ) -> None:
        super().__init__(message)
        self.refusal = refusal


def refusal_error(refusal: DecisionRefusal) -> RatifierError:
    """The typed error of a refusal, as the approver surfaces answer it."""
    text = REFUSAL_TEXT.get(refusal, _REFUSED)
    if refusal is DecisionRefusal.SAME_APPROVER:
        return AlreadyApproved(text, refusal=refusal)
    if refusal is DecisionRefusal.ARGUMENTS_WITHOUT_EDIT:
        return ArgumentsWithoutEdit(text, refusal=refusal)
    return DecisionRefused(text, refusal=refusal)


def error_json(exc: RatifierError) -> dict[str, Any]:
    """The approver surfaces' error body: code and message, and the refusal's name if any."""
    body: dict[str, Any] = {"code": exc.code.value, "message": exc.safe_message}
    refusal = getattr(exc, "refusal", None)
    if isinstance(refusal, DecisionRefusal):
        body["refusal"] = refusal.value
    return {"error": body}
