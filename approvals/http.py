"""The approver HTTP endpoint (JSON), an aiohttp route table mounted on the stateless stages'
process's one HTTP server beside its health pages (`ratifier stages`, runtime/shell.py). The
dashboard serves the same decisions under /api (dashboard/server.py) with the same
verification, signing and status map (`approvals.inbox`).

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

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
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
from schemas.envelopes import ApprovalVerdict, DecisionKind
from schemas.errors import RatifierError
from schemas.identity import ContextKeys
from schemas.settings import Settings


def _token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() or None


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _failure(exc: RatifierError) -> web.Response:
    status = HTTP_STATUS.get(exc.code, 400)
    return _json({"error": {"code": exc.code.value, "message": exc.safe_message}}, status)


def _unknown_verdict(allowed: str) -> web.Response:
    message = f"decision must be {allowed}"
    return _json({"error": {"code": "invalid_arguments", "message": message}}, 400)


def approval_routes(
    settings: Settings, *, inbox: ApprovalInbox, keys: ContextKeys
) -> Callable[[web.Application], None]:
    """The approval API's routes, for the HTTP server of the process that serves them."""
    signing: ApprovalKeys = approval_keys(settings)

    async def pending(request: web.Request) -> web.Response:
        try:
            approver = approver_from(_token(request), keys)
        except RatifierError as exc:
            return _failure(exc)
        await inbox.catch_up()
        items = [r.model_dump(mode="json") for r in inbox.pending(approver.tenant)]
        return _json({"tenant": approver.tenant, "pending": items})

    async def one(request: web.Request) -> web.Response:
        call_id = request.match_info["call_id"]
        try:
            approver = approver_from(_token(request), keys)
            await inbox.catch_up()
            found = inbox.get(approver.tenant, call_id)
        except RatifierError as exc:
            return _failure(exc)
        return _json(found.model_dump(mode="json"))

    async def decide(request: web.Request) -> web.Response:
        call_id = request.match_info["call_id"]
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
            return _failure(exc)
        except (ValueError, ValidationError):
            return _unknown_verdict("approve, reject or edit")
        await publish_decision(settings, decision)
        return _json({"published": True, "call_id": call_id, "fingerprint": found.fingerprint}, 202)

    async def confirmation(request: web.Request) -> web.Response:
        """End-user confirmation: the subject the call acts for (the resource's owner, with
        the context token the agent runtime issued for them) sees the exact preview and
        confirms or declines it. Anyone else's request looks absent."""
        call_id = request.match_info["call_id"]
        try:
            subject = subject_from(_token(request), keys)
            await inbox.catch_up()
            found = inbox.for_subject(subject, call_id)
        except RatifierError as exc:
            return _failure(exc)
        return _json(found.model_dump(mode="json"))

    async def confirm(request: web.Request) -> web.Response:
        call_id = request.match_info["call_id"]
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
            return _failure(exc)
        except (ValueError, ValidationError):
            return _unknown_verdict("approve or reject")
        await publish_decision(settings, decision)
        return _json(
            {
                "published": True,
                "call_id": call_id,
                "fingerprint": found.fingerprint,
                "decision_id": decision.decision_id,
            },
            202,
        )

    def mount(app: web.Application) -> None:
        app.router.add_get("/approvals", pending)
        app.router.add_get("/approvals/{call_id}", one)
        app.router.add_post("/approvals/{call_id}/decision", decide)
        app.router.add_get("/confirmations/{call_id}", confirmation)
        app.router.add_post("/confirmations/{call_id}", confirm)

    return mount
