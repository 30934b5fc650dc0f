"""The approver HTTP endpoint (JSON), an aiohttp route table mounted on the stateless stages'
process's one HTTP server beside its health pages (`ratifier stages`, runtime/shell.py). The
dashboard serves the same decisions under /api (dashboard/server.py) with the same
verification, signing and status map (`approvals.inbox`).

    GET  /approvals                      pending requests of the approver's tenant
    GET  /approvals/{call_id}            one pending request
    POST /approvals/{call_id}/decision   {"decision": "approve"|"reject"|"edit",
                                          "reason": "...", "arguments": {...} (edit only)}
    GET  /approvals/{call_id}/decisions/{decision_id}
                                         what the approval-join made of that decision
    GET  /confirmations/{call_id}        the request, for the subject it acts for only
    POST /confirmations/{call_id}        {"decision": "approve"|"reject", "reason": "..."}

Every call needs ``Authorization: Bearer <approver token>``. The endpoint verifies the token,
checks the decision with the join's own rule (`approvals.verdicts`: rights, self-approval,
the same approver twice, arguments on anything but an edit) and refuses it with a typed error
(nothing published), or publishes it as a statement signed with the approval service's key,
bound to the call, tenant and fingerprint of the request shown, and answers 202 with its
``decision_id`` and the URL to follow the join's verdict (``applied``, ``refused`` with the
reason, ``waiting_for_another_approver``). The token never leaves the request. The endpoint
writes no state itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from approvals.inbox import (
    HTTP_STATUS,
    ApprovalInbox,
    approver_from,
    decision_body,
    subject_from,
)
from approvals.policy import PolicyRights
from approvals.refusals import error_json
from approvals.signing import approval_keys
from approvals.verdicts import DecisionDesk, JoinAudit, published
from commands.catalog import Catalog
from config.settings import Settings
from runtime.clients import database_conninfo, pg_pool
from runtime.identity import ContextKeys
from schemas.envelopes import ApprovalVerdict, DecisionKind
from schemas.errors import InvalidArguments, RatifierError

CONFIRMATION_VERDICTS = frozenset({ApprovalVerdict.APPROVE, ApprovalVerdict.REJECT})


def _token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() or None


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _failure(exc: RatifierError) -> web.Response:
    return _json(error_json(exc), HTTP_STATUS.get(exc.code, 400))


async def _body_of(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise InvalidArguments("The body must be JSON.") from exc


def approval_routes(
    settings: Settings, *, inbox: ApprovalInbox, keys: ContextKeys, catalog: Catalog
) -> Callable[[web.Application], None]:
    """The approval API's routes, for the HTTP server of the process that serves them; the
    join's audit reader they follow verdicts with is closed with that server's app."""
    audit = JoinAudit(
        pg_pool(
            database_conninfo(settings), max_size=2, dict_rows=True, autocommit=True, read_only=True
        ),
        owned=True,
    )
    desk = DecisionDesk(
        settings=settings,
        signing=approval_keys(settings),
        rights=PolicyRights.for_settings(settings, catalog),
        catalog=catalog,
        audit=audit,
    )

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
            verdict, reason, arguments = decision_body(await _body_of(request))
            await inbox.catch_up()
            found = inbox.get(approver.tenant, call_id)
            decision = await desk.decide(
                found, approver=approver, verdict=verdict, reason=reason, arguments=arguments
            )
        except RatifierError as exc:
            return _failure(exc)
        follow = f"/approvals/{call_id}/decisions/{decision.decision_id}"
        return _json(published(decision, found, follow), 202)

    async def verdict(request: web.Request) -> web.Response:
        """The approval-join's verdict on one decision (of the approver's tenant)."""
        call_id, decision_id = request.match_info["call_id"], request.match_info["decision_id"]
        try:
            approver = approver_from(_token(request), keys)
            await inbox.catch_up()
            answer = await desk.verdict(
                approver.tenant, call_id, decision_id, outcome=inbox.outcome(call_id)
            )
        except RatifierError as exc:
            return _failure(exc)
        return _json(answer.to_json())

    async def confirmation(request: web.Request) -> web.Response:
        """End-user confirmation: the subject the call acts for (the resource's owner, with
        the context token the agent runtime issued for them) sees the exact preview. Anyone
        else's request looks absent."""
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
            verdict, reason, _ = decision_body(
                await _body_of(request), allowed=CONFIRMATION_VERDICTS
            )
            await inbox.catch_up()
            found = inbox.for_subject(subject, call_id)
            decision = await desk.decide(
                found,
                approver=subject,
                verdict=verdict,
                reason=reason,
                kind=DecisionKind.CONFIRMATION,
            )
        except RatifierError as exc:
            return _failure(exc)
        follow = f"/approvals/{call_id}/decisions/{decision.decision_id}"
        return _json(published(decision, found, follow), 202)

    async def close_audit(_app: web.Application) -> None:
        await audit.close()

    def mount(app: web.Application) -> None:
        app.router.add_get("/approvals", pending)
        app.router.add_get("/approvals/{call_id}", one)
        app.router.add_post("/approvals/{call_id}/decision", decide)
        app.router.add_get("/approvals/{call_id}/decisions/{decision_id}", verdict)
        app.router.add_get("/confirmations/{call_id}", confirmation)
        app.router.add_post("/confirmations/{call_id}", confirm)
        app.on_cleanup.append(close_audit)

    return mount
