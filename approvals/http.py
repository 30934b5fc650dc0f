"""The approver HTTP endpoint, served by the streams worker (JSON). The dashboard serves the
same decisions under /api (dashboard/server.py) with the same verification, signing and
status map (`approvals.inbox`).

    GET  /approvals                      pending requests of the approver's tenant
    GET  /approvals/{call_id}            one pending request
    POST /approvals/{call_id}/decision   {"decision": "approve"|"reject"|"edit",
                                          "reason": "...", "arguments": {...}}
    GET  /confirmations/{call_id}        the request, for the subject it acts for only
    POST /confirmations/{call_id}        {"decision": "approve"|"reject", "reason": "..."}

Every call needs ``Authorization: Bearer <approver token>``. The endpoint verifies the token,
then publishes the decision as a statement signed with the approval service's key, bound to
the call, tenant and fingerprint of the request shown; the token never leaves the request.
The endpoint writes no state itself.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.web import Request, Response, View
from pydantic import ValidationError

from approvals.inbox import (
    HTTP_STATUS,
    ApprovalInbox,
    approver_from,
    decision_for,
    publish_decision,
    subject_from,
)
from approvals.signing import ApprovalKeys, approval_keys
from config.settings import Settings
from runtime.identity import ContextKeys
from schemas.envelopes import ApprovalVerdict, DecisionKind
from schemas.errors import RatifierError


def _token(request: Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() or None


def install_approval_api(
    app: faust.App, settings: Settings, *, inbox: ApprovalInbox, keys: ContextKeys
) -> None:
    signing: ApprovalKeys = approval_keys(settings)

    def failure(view: View, exc: RatifierError) -> Response:
        status = HTTP_STATUS.get(exc.code, 400)
        return view.json(
            {"error": {"code": exc.code.value, "message": exc.safe_message}}, status=status
        )

    def unknown_verdict(view: View, allowed: str) -> Response:
        message = f"decision must be {allowed}"
        return view.json({"error": {"code": "invalid_arguments", "message": message}}, status=400)

    @app.page("/approvals")
    class Pending(View):
        async def get(self, request: Request) -> Response:
            try:
                approver = approver_from(_token(request), keys)
            except RatifierError as exc:
                return failure(self, exc)
            await inbox.catch_up()
            items = [r.model_dump(mode="json") for r in inbox.pending(approver.tenant)]
            return self.json({"tenant": approver.tenant, "pending": items})

    @app.page("/approvals/{call_id}")
    class One(View):
        async def get(self, request: Request, call_id: str) -> Response:
            try:
                approver = approver_from(_token(request), keys)
                await inbox.catch_up()
                found = inbox.get(approver.tenant, call_id)
            except RatifierError as exc:
                return failure(self, exc)
            return self.json(found.model_dump(mode="json"))

    @app.page("/approvals/{call_id}/decision")
    class Decide(View):
        async def post(self, request: Request, call_id: str) -> Response:
            try:
                approver = approver_from(_token(request), keys)
                body: dict[str, Any] = await request.json()
                verdict = ApprovalVerdict(str(body.get("decision")))
                await inbox.catch_up()
                found = inbox.get(approver.tenant, call_id)
                decision = decision_for(
                    found,
                    approver=approver,
                    keys=signing,
                    verdict=verdict,
                    reason=body.get("reason"),
                    arguments=body.get("arguments"),
                )
            except RatifierError as exc:
                return failure(self, exc)
            except (ValueError, ValidationError):
                return unknown_verdict(self, "approve, reject or edit")
            await publish_decision(settings, decision)
            return self.json(
                {"published": True, "call_id": call_id, "fingerprint": found.fingerprint},
                status=202,
            )

    @app.page("/confirmations/{call_id}")
    class Confirmation(View):
        """End-user confirmation: the subject the call acts for (the resource's owner, with
        the context token the agent runtime issued for them) sees the exact preview and
        confirms or declines it. Anyone else's request looks absent."""

        async def get(self, request: Request, call_id: str) -> Response:
            try:
                subject = subject_from(_token(request), keys)
                await inbox.catch_up()
                found = inbox.for_subject(subject, call_id)
            except RatifierError as exc:
                return failure(self, exc)
            return self.json(found.model_dump(mode="json"))

        async def post(self, request: Request, call_id: str) -> Response:
            try:
                subject = subject_from(_token(request), keys)
                body: dict[str, Any] = await request.json()
                verdict = ApprovalVerdict(str(body.get("decision")))
                if verdict is ApprovalVerdict.EDIT:
                    raise ValueError("a confirmation approves or rejects")
                await inbox.catch_up()
                found = inbox.for_subject(subject, call_id)
                decision = decision_for(
                    found,
                    approver=subject,
                    keys=signing,
                    verdict=verdict,
                    reason=body.get("reason"),
                    kind=DecisionKind.CONFIRMATION,
                )
            except RatifierError as exc:
                return failure(self, exc)
            except (ValueError, ValidationError):
                return unknown_verdict(self, "approve or reject")
            await publish_decision(settings, decision)
            return self.json(
                {
                    "published": True,
                    "call_id": call_id,
                    "fingerprint": found.fingerprint,
                    "decision_id": decision.decision_id,
                },
                status=202,
            )

    del Pending, One, Decide, Confirmation  # registered with the app
