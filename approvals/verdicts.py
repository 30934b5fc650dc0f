"""What became of an approver's decision, told to the approver (HTTP API and dashboard).

Before a decision is published, what can be checked is checked with the rule the
approval-join decides with (`approvals.rights.approver_refusal`): the approver's rights,
self-approval, arguments on anything but an edit, and, from the join's own audit of the call,
the same approver twice on a call that needs several. A refusal is a typed error and nothing
is published. What only the join can decide (signature, freshness, a decision racing another)
is followed afterwards: the join audits every decision it counts or refuses, by decision id,
and `verdict_from` turns that audit into a status (`DecisionStatus`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from approvals.inbox import publish_decision, statement_of
from approvals.pending import TERMINAL_STATUS_VALUES
from approvals.refusals import error_json, refusal_error
from approvals.rights import ApproverRights, approver_refusal, pending_from_request
from approvals.signing import ApprovalKeys, DecisionRefusal, sign_decision
from commands.catalog import Catalog
from commands.sql import named_query
from config.settings import Settings
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalVerdict,
    DecisionKind,
    DecisionStatement,
)
from schemas.errors import InvalidArguments, StorageUnavailable

_PKG = "approvals"


def approved_by(rows: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Who approved the call so far, as the join counted them (its `approval_decision`
    audit rows: one per approval it accepted)."""
    subs: list[str] = []
    for row in rows:
        detail = row.get("detail") or {}
        if row.get("kind") == "approval_decision" and detail.get("decision") == "approve":
            sub = detail.get("approver")
            if isinstance(sub, str) and sub not in subs:
                subs.append(sub)
    return tuple(subs)


def check_decision(
    statement: DecisionStatement,
    request: ApprovalRequest,
    *,
    catalog: Catalog,
    rights: ApproverRights,
    rows: Iterable[Mapping[str, Any]],
) -> None:
    """Raise the typed refusal the join would give ``statement`` on ``request``, as far as
    the request and the join's audit of the call (``rows``) tell."""
    refusal = approver_refusal(
        statement,
        pending_from_request(request, catalog.get(request.tool)),
        rights=rights,
        approved_by=approved_by(rows),
        required_approvals=request.required_approvals,
    )
    if refusal is not None:
        raise refusal_error(refusal)


class DecisionStatus(StrEnum):
    """What became of a published decision, as the approval-join's audit tells."""

    PUBLISHED = "published"  # on Kafka; the join has not answered yet: ask again
    HELD = "held"  # it arrived before its request; the join holds it for a while
    WAITING = "waiting_for_another_approver"  # counted; the call needs more approvers
    APPLIED = "applied"  # counted and decided the call (committed, rejected or edited)
    REFUSED = "refused"  # the join refused it (`refusal` says why); nothing changed


@dataclass(frozen=True, kw_only=True)
class DecisionVerdict:
    call_id: str
    decision_id: str
    status: DecisionStatus
    refusal: DecisionRefusal | None = None
    approvals: int | None = None
    required_approvals: int | None = None
    outcome: str | None = None  # the call's terminal outcome status, once there is one

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "call_id": self.call_id,
            "decision_id": self.decision_id,
            "status": self.status.value,
            "approvals": self.approvals,
            "required_approvals": self.required_approvals,
            "outcome": self.outcome,
        }
        if self.refusal is not None:
            body.update(error_json(refusal_error(self.refusal)))
        return body


def verdict_from(
    rows: Iterable[Mapping[str, Any]], *, call_id: str, decision_id: str, outcome: str | None
) -> DecisionVerdict:
    """The join's verdict on ``decision_id`` from its audit rows of the call. Once the join
    counted a decision, a later refusal of the same id (a redelivered record:
    `decision_reused`) does not undo it."""
    counted: Mapping[str, Any] | None = None
    refused: DecisionRefusal | None = None
    held = False
    for row in rows:
        detail = row.get("detail") or {}
        if detail.get("decision_id") != decision_id:
            continue
        kind = row.get("kind")
        if kind == "approval_decision":
            counted = detail
        elif kind == "approval_decision_refused" and refused is None:
            try:
                refused = DecisionRefusal(str(detail.get("refusal")))
            except ValueError:
                refused = DecisionRefusal.MALFORMED
        elif kind == "approval_decision_held":
            held = True
    ended = outcome if outcome in TERMINAL_STATUS_VALUES else None
    if counted is not None:
        approvals, required = counted.get("approvals"), counted.get("required_approvals")
        waiting = isinstance(approvals, int) and isinstance(required, int) and approvals < required
        return DecisionVerdict(
            call_id=call_id,
            decision_id=decision_id,
            status=DecisionStatus.WAITING if waiting and ended is None else DecisionStatus.APPLIED,
            approvals=approvals if isinstance(approvals, int) else None,
            required_approvals=required if isinstance(required, int) else None,
            outcome=ended,
        )
    if refused is not None:
        status = DecisionStatus.REFUSED
    else:
        status = DecisionStatus.HELD if held else DecisionStatus.PUBLISHED
    return DecisionVerdict(
        call_id=call_id, decision_id=decision_id, status=status, refusal=refused, outcome=ended
    )


class JoinAudit:
    """Reads the approval-join's audit of a call's decisions (tenant in the WHERE)."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, owned: bool = False) -> None:
        self._pool = pool
        self._owned = owned
        self._opened = not owned
        self._lock = asyncio.Lock()

    async def decisions(self, tenant: str, call_id: str) -> list[dict[str, Any]]:
        if not self._opened:
            async with self._lock:
                if not self._opened:
                    await self._pool.open(wait=False)
                    self._opened = True
        try:
            async with self._pool.connection(timeout=5) as conn, conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "decision_audit"), {"tenant": tenant, "call_id": call_id}
                )
                return [dict(r) for r in await cur.fetchall()]
        except (psycopg.Error, PoolTimeout, TimeoutError) as exc:
            raise StorageUnavailable("The approval audit is not reachable.") from exc

    async def close(self) -> None:
        if self._owned and self._opened:
            await self._pool.close()


@dataclass(frozen=True, kw_only=True)
class DecisionDesk:
    """Where the approver surfaces take a decision: check it, sign it, publish it, and
    answer what became of it."""

    settings: Settings
    signing: ApprovalKeys
    rights: ApproverRights
    catalog: Catalog
    audit: JoinAudit

    async def decide(
        self,
        request: ApprovalRequest,
        *,
        approver: Actor,
        verdict: ApprovalVerdict,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        kind: DecisionKind = DecisionKind.APPROVER,
    ) -> ApprovalDecision:
        """Publish the signed decision, or raise the typed refusal (nothing published)."""
        try:
            statement = statement_of(
                request,
                approver=approver,
                keys=self.signing,
                verdict=verdict,
                reason=reason,
                arguments=arguments,
                kind=kind,
                now=datetime.now(UTC),
            )
        except ValidationError as exc:
            raise InvalidArguments("The decision is not valid (reason too long?).") from exc
        rows = await self.audit.decisions(request.tenant, request.call_id)
        check_decision(statement, request, catalog=self.catalog, rights=self.rights, rows=rows)
        decision = sign_decision(statement, self.signing)
        await publish_decision(self.settings, decision)
        return decision

    async def verdict(
        self, tenant: str, call_id: str, decision_id: str, *, outcome: str | None
    ) -> DecisionVerdict:
        rows = await self.audit.decisions(tenant, call_id)
        return verdict_from(rows, call_id=call_id, decision_id=decision_id, outcome=outcome)


def published(decision: ApprovalDecision, request: ApprovalRequest, follow: str) -> dict[str, Any]:
    """The answer to a published decision (202): its id and where to follow the verdict."""
    return {
        "published": True,
        "status": DecisionStatus.PUBLISHED.value,
        "call_id": decision.call_id,
        "decision": decision.decision.value,
        "decision_id": decision.decision_id,
        "fingerprint": request.fingerprint,
        "follow": follow,
    }
