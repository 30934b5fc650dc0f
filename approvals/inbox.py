"""The approval inbox as approvers see it: requests on `approvals.requested` that have no
terminal outcome yet, per tenant. Read from the topics (the join's table is partitioned
across workers; the topics are the whole picture), and decisions published as signed
`approvals.decided` records: the inbox never writes state.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from approvals.pending import TERMINAL_STATUS_VALUES, is_pending, pending_order
from approvals.refusals import refusal_error
from approvals.rights import APPROVER_ROLE
from approvals.signing import ApprovalKeys, DecisionRefusal, statement_for
from config.settings import Settings
from runtime.clients import kafka_producer
from runtime.identity import ContextKeys, verify_context_token
from runtime.reader import TopicReader
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalVerdict,
    DecisionKind,
    DecisionStatement,
)
from schemas.errors import (
    ErrorCode,
    InvalidArguments,
    PolicyDenied,
    ResourceNotFound,
    Unauthenticated,
)
from schemas.names import Topic

# The one status map of the approver surfaces (this package's HTTP API and the dashboard).
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.POLICY_DENIED: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.APPROVAL_EXPIRED: 410,
    ErrorCode.INVALID_ARGUMENTS: 400,
    ErrorCode.CONFLICT: 409,
    ErrorCode.RETRYABLE_ERROR: 503,
}


def approver_from(token: str | None, keys: ContextKeys) -> Actor:
    """The approver named by ``token``; it must verify and carry the approver role."""
    if not token:
        raise Unauthenticated()
    actor = verify_context_token(token, keys)
    if APPROVER_ROLE not in actor.roles:
        raise PolicyDenied("This token does not carry the approver role.")
    return actor


def subject_from(token: str | None, keys: ContextKeys) -> Actor:
    """The end user named by ``token`` (no role needed: ownership is checked per request)."""
    if not token:
        raise Unauthenticated()
    return verify_context_token(token, keys)


class ApprovalInbox:
    """Pending requests, kept from the `approvals.requested` and `outcomes` topics."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pending: dict[str, ApprovalRequest] = {}
        # The terminal outcome status of every call that ended (the inbox drops its request).
        self._ended: dict[str, str] = {}
        self._reader = TopicReader(
            settings, [Topic.APPROVALS_REQUESTED, Topic.OUTCOMES], self.apply
        )

    def apply(self, topic: str, value: bytes | None) -> None:
        try:
            body = json.loads(value or b"")
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        if topic == self._settings.topic(Topic.APPROVALS_REQUESTED):
            try:
                request = ApprovalRequest.model_validate(body)
            except ValidationError:
                return
            if request.call_id not in self._ended:
                self._pending[request.call_id] = request
        elif body.get("status") in TERMINAL_STATUS_VALUES and isinstance(body.get("call_id"), str):
            self._ended[body["call_id"]] = body["status"]
            self._pending.pop(body["call_id"], None)

    def pending(self, tenant: str, now: datetime | None = None) -> list[ApprovalRequest]:
        now = now or datetime.now(UTC)
        return sorted(
            (r for r in self._pending.values() if is_pending(r, now=now, tenant=tenant)),
            key=pending_order,
        )

    def outcome(self, call_id: str) -> str | None:
        """The terminal outcome status of ``call_id``, once it has one."""
        return self._ended.get(call_id)

    def get(self, tenant: str, call_id: str) -> ApprovalRequest:
        """The pending request; absent and other tenants' look the same."""
        request = self._pending.get(call_id)
        if request is None or request.tenant != tenant:
            raise ResourceNotFound()
        return request

    def for_subject(self, subject: Actor, call_id: str) -> ApprovalRequest:
        """The pending request a subject may confirm: theirs only; others' look absent."""
        request = self.get(subject.tenant, call_id)
        if request.subject is None or request.subject != subject.sub:
            raise ResourceNotFound()
        return request

    async def catch_up(self) -> None:
        """Read both topics up to their ends as of now (concurrent callers share one read;
        one consumer for the inbox's lifetime, so each catch-up reads only what is new)."""
        await self._reader.catch_up()

    async def close(self) -> None:
        await self._reader.close()


def decision_body(
    body: Any, *, allowed: frozenset[ApprovalVerdict] = frozenset(ApprovalVerdict)
) -> tuple[ApprovalVerdict, str | None, dict[str, Any] | None]:
    """The verdict, reason and (for an edit only) arguments of a decision's JSON body, the
    same on every approver surface. Arguments on an approve or a reject are refused, never
    ignored: the approver would believe they counted."""
    if not isinstance(body, dict):
        raise InvalidArguments("The body must be a JSON object.")
    names = " or ".join(v.value for v in ApprovalVerdict if v in allowed)
    try:
        verdict = ApprovalVerdict(str(body.get("decision")))
    except ValueError as exc:
        raise InvalidArguments(f"decision must be {names}.") from exc
    if verdict not in allowed:
        raise InvalidArguments(f"decision must be {names}.")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidArguments("reason must be text.")
    arguments = body.get("arguments")
    if verdict is ApprovalVerdict.EDIT:
        if not isinstance(arguments, dict) or not arguments:
            raise InvalidArguments("An edit needs the new arguments as a JSON object.")
    elif arguments is not None:
        raise refusal_error(DecisionRefusal.ARGUMENTS_WITHOUT_EDIT)
    return verdict, (reason or None), arguments


def statement_of(
    request: ApprovalRequest,
    *,
    approver: Actor,
    keys: ApprovalKeys,
    verdict: ApprovalVerdict,
    reason: str | None = None,
    arguments: dict[str, Any] | None = None,
    fingerprint: str | None = None,
    kind: DecisionKind = DecisionKind.APPROVER,
    now: datetime | None = None,
) -> DecisionStatement:
    """A decision about the request the human saw (its call, tenant and fingerprint), by the
    approver the caller authenticated, ready to check and sign. The approver's token stays
    with the caller: it is never part of the decision."""
    return statement_for(
        call_id=request.call_id,
        tenant=request.tenant,
        fingerprint=fingerprint or request.fingerprint,
        approver=approver,
        verdict=verdict,
        now=now or datetime.now(UTC),
        validity=keys.decision_validity,
        not_after=request.expires_at,
        reason=reason,
        arguments=arguments,
        kind=kind,
    )


async def publish_decision(settings: Settings, decision: ApprovalDecision) -> None:
    producer = kafka_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topic(Topic.APPROVALS_DECIDED),
            key=decision.call_id.encode(),
            value=decision.to_bytes(),
        )
    finally:
        await producer.stop()
