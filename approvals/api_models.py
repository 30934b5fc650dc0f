"""The shapes of the approver HTTP surfaces' bodies (approvals/http.py and the dashboard's
/api/approvals...): what they accept and answer, as frozen pydantic models. The OpenAPI
documents (`ratifier/openapi.py`, ``schemas/json/openapi-*.json``) take their schemas from
here; tests check the handlers' real answers against them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from approvals.signing import DecisionRefusal
from approvals.verdicts import DecisionStatus
from schemas.envelopes import ApprovalRequest, ApprovalVerdict
from schemas.errors import ErrorCode


class Body(BaseModel):
    """An HTTP body: frozen, unknown keys forbidden."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ErrorDetail(Body):
    """What went wrong: the contract's error code, a message safe to show, and for a refused
    decision the refusal's name (`approvals.refusals.error_json`)."""

    code: ErrorCode
    message: str
    refusal: DecisionRefusal | None = Field(
        default=None, description="present only when a decision was refused"
    )


class ErrorAnswer(Body):
    """Every error answer of the approver surfaces and the dashboard's API."""

    error: ErrorDetail


class DecisionRequest(Body):
    """An approver's decision on a pending request (`approvals.inbox.decision_body`)."""

    decision: ApprovalVerdict
    reason: str | None = Field(default=None, description="kept in the audit")
    arguments: dict[str, Any] | None = Field(
        default=None,
        description="the new arguments: an edit only (on approve or reject: 400, "
        "refusal arguments_without_edit)",
    )


class ConfirmationRequest(Body):
    """The end user's confirmation of a call that acts for them."""

    decision: Literal["approve", "reject"]
    reason: str | None = None


class DecisionPublished(Body):
    """202: the signed decision is on `approvals.decided` (`approvals.verdicts.published`);
    ``follow`` is where its verdict is read."""

    published: Literal[True]
    status: Literal["published"]
    call_id: str
    decision: ApprovalVerdict
    decision_id: str
    fingerprint: str
    follow: str


class DecisionVerdictAnswer(Body):
    """What the approval-join made of one decision (`approvals.verdicts.DecisionVerdict`);
    ``error`` when it refused it."""

    call_id: str
    decision_id: str
    status: DecisionStatus
    approvals: int | None
    required_approvals: int | None
    outcome: str | None = Field(description="the call's terminal outcome status, once known")
    error: ErrorDetail | None = Field(default=None, description="present only when refused")


class PendingAnswer(Body):
    """The approver tenant's pending requests (`GET /approvals`)."""

    tenant: str
    pending: list[ApprovalRequest]
