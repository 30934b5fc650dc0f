"""The approver HTTP endpoint, served by the streams worker (JSON). The dashboard serves the
same decisions under /api (dashboard/server.py) with the same verification, signing and
status map (`approvals.inbox`).

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

from typing import Any

import faust
from faust.web import Request, Response, View

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


def _token(request: Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() or None


def install_approval_api(
    app: faust.App,
    settings: Settings,
    *,
    inbox: ApprovalInbox,
    keys: ContextKeys,
    catalog: Catalog,
) -> JoinAudit:
    """Register the views; the returned audit reader is the caller's to close."""
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

    def failure(view: View, exc: RatifierError) -> Response:
        return view.json(error_json(exc), status=HTTP_STATUS.get(exc.code, 400))

    async def body_of(request: Request) -> Any:
        try:
            return await request.json()
        except ValueError as exc:
            raise InvalidArguments("The body must be JSON.") from exc

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
                verdict, reason, arguments = decision_body(await body_of(request))
                await inbox.catch_up()
                found = inbox.get(approver.tenant, call_id)
                decision = await desk.decide(
                    found, approver=approver, verdict=verdict, reason=reason, arguments=arguments
                )
            except RatifierError as exc:
                return failure(self, exc)
            follow = f"/approvals/{call_id}/decisions/{decision.decision_id}"
            return self.json(published(decision, found, follow), status=202)

    @app.page("/approvals/{call_id}/decisions/{decision_id}")
    class Verdict(View):
        """The approval-join's verdict on one decision (of the approver's tenant)."""

        async def get(self, request: Request, call_id: str, decision_id: str) -> Response:
            try:
                approver = approver_from(_token(request), keys)
                await inbox.catch_up()
                answer = await desk.verdict(
                    approver.tenant, call_id, decision_id, outcome=inbox.outcome(call_id)
                )
            except RatifierError as exc:
                return failure(self, exc)
            return self.json(answer.to_json())

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
                verdict, reason, _ = decision_body(
                    await body_of(request), allowed=CONFIRMATION_VERDICTS
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
                return failure(self, exc)
            follow = f"/approvals/{call_id}/decisions/{decision.decision_id}"
            return self.json(published(decision, found, follow), status=202)

    del Pending, One, Decide, Verdict, Confirmation  # registered with the app
    return audit
