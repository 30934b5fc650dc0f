"""A call's whole story, from what the audit store holds: the pipeline's records (the sink's
`audit_records`), the stages' own audit rows (`audit_log`: approval decisions with the
verified approver, executions, reconciliation) and the command ledger. Pure: rows in, ordered
events and text out."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from schemas.envelopes import Status
from schemas.vocabulary import AuditKind

Facts = tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class Event:
    at: datetime
    stage: str  # who did it: agent, validator, authorizer, approval, executor, reconciler
    what: str
    source: str  # where it is recorded: a topic, audit_log or command_ledger
    facts: Facts = ()
    rank: int = 50  # pipeline order, only to break ties between equal times

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "stage": self.stage,
            "what": self.what,
            "source": self.source,
            "facts": dict(self.facts),
        }


@dataclass(frozen=True, kw_only=True)
class Story:
    call_id: str
    tenant: str | None
    tool: str | None
    final: str | None  # the last terminal outcome's status, if any
    events: tuple[Event, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tenant": self.tenant,
            "tool": self.tool,
            "final": self.final,
            "events": [e.as_json() for e in self.events],
        }


def _compact(value: Any, limit: int = 300) -> str:
    if isinstance(value, datetime):
        text = value.astimezone(UTC).isoformat()
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _facts(**pairs: Any) -> Facts:
    """Non-empty facts, in the order given, as display strings."""
    return tuple((k, _compact(v)) for k, v in pairs.items() if v not in (None, "", [], {}, ()))


def _short(digest: Any) -> str | None:
    return f"{digest[:19]}…" if isinstance(digest, str) and len(digest) > 20 else digest


def _who(token: Any) -> str | None:
    """A masked token (see `audit.masking`) as the identity it proved."""
    if not isinstance(token, dict):
        return None
    if not token.get("verified"):
        return f"unverified token {token.get('sha256', '')}"
    roles = ", ".join(token.get("roles") or ()) or "none"
    return f"{token.get('sub')} @ {token.get('tenant')} (roles: {roles}; token verified)"


def _approval(receipt: Any) -> str | None:
    if not isinstance(receipt, dict):
        return None
    if receipt.get("basis") == "auto":
        return (
            f"auto-approved by policy {receipt.get('auto_policy')} at {receipt.get('decided_at')}"
        )
    return f"approved by {receipt.get('approver')} at {receipt.get('decided_at')}"


# -- pipeline records (audit_records) ------------------------------------------------------


def _proposed(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "agent",
        "proposed",
        _facts(
            tool=r.get("tool"),
            format=r.get("format") if r.get("format") not in (None, "native") else None,
            call=r.get("call"),
            arguments=r.get("arguments"),
            idempotency_key=r.get("idempotency_key"),
            actor=_who(r.get("context")),
        ),
        0,
    )


def _validated(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "validator",
        "validated: tool exists, arguments match its schema",
        _facts(tool=r.get("tool"), arguments=r.get("arguments")),
        10,
    )


def _authorized(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    actor = r.get("actor") or {}
    roles = ", ".join(actor.get("roles") or ()) or "none"
    route = r.get("route")
    return (
        "authorizer",
        "authorized: policy permits" + (" — needs approval" if route == "approval" else ""),
        _facts(
            actor=f"{actor.get('sub')} @ {r.get('tenant')} (roles: {roles})",
            policy_version=r.get("policy_version"),
            policies=", ".join(r.get("policies") or ()) or None,
            effect=r.get("effect"),
            route=route,
            operation_id=r.get("operation_id"),
            fingerprint=_short(r.get("fingerprint")),
        ),
        20,
    )


def _requested(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "approval",
        "approval requested",
        _facts(
            requested_by=r.get("requested_by"),
            preview=" | ".join(r.get("preview") or ()),
            policy_version=r.get("policy_version"),
            expires_at=r.get("expires_at"),
            fingerprint=_short(r.get("fingerprint")),
        ),
        30,
    )


def _decided(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "approval",
        f"decision received: {r.get('decision')}",
        _facts(
            decision_id=r.get("decision_id"),
            approver=r.get("decided_by") or _who(r.get("approver")),
            reason=r.get("reason"),
            arguments=r.get("arguments"),
            decided_at=r.get("decided_at"),
            fingerprint=_short(r.get("fingerprint")),
        ),
        40,
    )


def _committed(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "approval" if r.get("approval") else "authorizer",
        "command committed for execution",
        _facts(
            operation_id=r.get("operation_id"),
            approval=_approval(r.get("approval")) or "none needed (auto route)",
            policy_version=r.get("policy_version"),
            # v1.8: for a call the authorizer committed, its only record of the permits.
            policies=", ".join(r.get("policies") or ()) or None,
            arguments=r.get("arguments"),
        ),
        50,
    )


def _unknown(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "executor",
        "outcome unknown: handed to reconciliation",
        _facts(operation_id=r.get("operation_id")),
        65,
    )


# What a security reader needs to know about a code beyond the message the agent was shown.
_MEANINGS = {
    "not_found": "the resource is absent or belongs to another tenant (the agent is never told "
    "which); nothing was read or changed",
    "policy_denied": "no Cedar policy permits this; nothing was executed",
    "unauthenticated": "the context token did not verify; the call went no further",
    "precondition_failed": "the state changed between authorization and execution",
    "timeout": "the effect may or may not have happened; reconciliation decides",
    "conflict": "the idempotency key was already used with other arguments",
    "rate_limited": "a rate, concurrency or load limit refused the call at admission; nothing "
    "was executed or queued, and the agent was told when to retry (retry_after)",
}


# A refusal's reason (`ErrorInfo.reason`) says more than its code.
_REASON_MEANINGS = {
    "forbid": "a Cedar forbid policy matched; nothing was executed",
    "no_permit": "no Cedar policy permits this; nothing was executed",
    "evaluation_error": "a Cedar policy could not be evaluated, so the call was denied (fail "
    "closed); Cedar's diagnostics are in the service log",
    "handler": "the tool's handler refused the call",
    "approver": "a human approver rejected the call",
}


def _meaning(error: Mapping[str, Any]) -> str | None:
    return _REASON_MEANINGS.get(str(error.get("reason"))) or _MEANINGS.get(str(error.get("code")))


# Ties: an awaiting outcome follows its approval request; an unknown one precedes its hand-over
# to reconciliation; every other outcome ends its step.
_OUTCOME_RANKS = {Status.AWAITING_APPROVAL.value: 35, Status.UNKNOWN.value: 62}


def _outcome(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    error = r.get("error") or {}
    status = r.get("status")
    stage = {"validate": "validator", "authorize": "authorizer", "approve": "approval"}.get(
        str(r.get("stage")), str(r.get("stage") or "?")
    )
    if stage == "execute":
        stage = "executor"
    elif stage == "reconcile":
        stage = "reconciler"
    return (
        stage,
        f"outcome: {status}" + (f" ({error.get('code')})" if error.get("code") else ""),
        _facts(
            message=error.get("message"),
            meaning=_meaning(error),
            policies=", ".join(error.get("policies") or ()) or None,
            fields=error.get("fields"),
            resource_id=r.get("resource_id"),
            result=r.get("result"),
            policy_version=r.get("policy_version"),
            approval=_approval(r.get("approval")),
            operation_id=r.get("operation_id"),
        ),
        _OUTCOME_RANKS.get(str(status), 90),
    )


def _dead_letter(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return (
        "validator",
        "dead-lettered: not a valid envelope",
        _facts(reason=r.get("reason"), raw=r.get("raw"), raw_sha256=r.get("raw_sha256")),
        5,
    )


def _cancelled(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    return ("agent", "cancel requested", _facts(reason=r.get("reason")), 45)


def _notification_dead(r: Mapping[str, Any]) -> tuple[str, str, Facts, int]:
    # v1.5: an approver notification (webhook) the notifier gave up on.
    return (
        "notifier",
        "notification dead-lettered: {endpoint} ({kind})".format(
            endpoint=r.get("endpoint"), kind=r.get("kind")
        ),
        _facts(
            delivery_id=r.get("delivery_id"),
            attempts=r.get("attempts"),
            last_error=r.get("last_error"),
        ),
        32,
    )


_RECORD_EVENTS: dict[str, Callable[[Mapping[str, Any]], tuple[str, str, Facts, int]]] = {
    "calls.proposed": _proposed,
    "calls.validated": _validated,
    "calls.authorized": _authorized,
    "approvals.requested": _requested,
    "approvals.decided": _decided,
    "commands.committed": _committed,
    "commands.unknown": _unknown,
    "outcomes": _outcome,
    "calls.deadletter": _dead_letter,
    "calls.cancelled": _cancelled,
    "notifications.deadletter": _notification_dead,
}


def record_event(row: Mapping[str, Any]) -> Event:
    """One `audit_records` row (columns as named in the table)."""
    record = row["record"] if isinstance(row["record"], dict) else {}
    source = f"{row['stream']} p{row['kafka_partition']}@{row['kafka_offset']}"
    if record.get("unparseable"):
        return Event(
            at=row["record_at"],
            stage="?",
            what="unreadable record",
            source=source,
            facts=_facts(sha256=record.get("sha256"), bytes=record.get("bytes")),
        )
    build = _RECORD_EVENTS.get(row["stream"])
    if build is None:
        return Event(at=row["record_at"], stage="?", what=row["stream"], source=source)
    stage, what, facts, rank = build(record)
    return Event(at=row["record_at"], stage=stage, what=what, source=source, facts=facts, rank=rank)


# -- the stages' own audit rows (audit_log) ----------------------------------------------


def _log_facts(detail: Mapping[str, Any], *names: str) -> Facts:
    return _facts(**{n: detail.get(n) for n in names})


_LOG_EVENTS: dict[AuditKind, tuple[str, str, tuple[str, ...], int]] = {
    AuditKind.APPROVAL_REQUESTED: (
        "approval",
        "approval request recorded",
        ("requested_by", "expires_at", "policy_version"),
        31,
    ),
    AuditKind.APPROVAL_DECISION: (
        "approval",
        "decision accepted: {decision} by {approver}",
        ("approver", "approver_tenant", "reason", "decided_at", "policy_version"),
        41,
    ),
    AuditKind.APPROVAL_DECISION_INVALID: (
        "approval",
        "decision refused: {reason}",
        ("decision", "approver", "approver_tenant", "decided_at"),
        41,
    ),
    AuditKind.APPROVAL_DECISION_REFUSED: (
        "approval",
        "signed decision refused: {refusal}",
        ("decision_id", "decision_call_id", "decision", "approver", "approver_tenant"),
        41,
    ),
    AuditKind.APPROVAL_AUTO: (
        "approval",
        "auto-approved by policy {policy}",
        ("policy", "policy_version", "fingerprint"),
        41,
    ),
    AuditKind.APPROVAL_DECISION_HELD: (
        "approval",
        "decision held: request not seen yet",
        ("decision", "approver", "approver_tenant"),
        41,
    ),
    AuditKind.APPROVAL_DECISION_DROPPED: (
        "approval",
        "decision dropped: its request never arrived",
        ("decision", "approver"),
        41,
    ),
    AuditKind.APPROVAL_EDIT_COMMITTED: (
        "approval",
        "edit re-validated and re-authorized: {approver}",
        ("approver", "policy_version", "original_fingerprint"),
        42,
    ),
    AuditKind.APPROVAL_EDIT_REFUSED: (
        "approval",
        "edited arguments refused: {code}",
        ("approver", "code", "policy_version"),
        42,
    ),
    AuditKind.APPROVAL_EXPIRED: (
        "approval",
        "approval expired: nobody decided in time",
        ("expires_at",),
        42,
    ),
    AuditKind.APPROVAL_FROZEN: (
        "approval",
        "approval refused: scope {scope} is frozen",
        ("frozen_by", "frozen_reason", "policy_version"),
        42,
    ),
    AuditKind.APPROVAL_JOINED: (
        "approval",
        "joined the pending approval request of {joins} (same operation)",
        ("joins", "fingerprint", "policy_version"),
        40,
    ),
    AuditKind.EXECUTED: (
        "executor",
        "executed, recorded in the ledger: {status}",
        ("operation_id", "status", "code", "policy_version", "approver", "auto_policy"),
        70,
    ),
    AuditKind.READ: (
        "executor",
        "read executed (no ledger entry: a read has no effect to deduplicate): {status}",
        ("operation_id", "status", "code", "policy_version"),
        70,
    ),
    AuditKind.LATE_RESULT: (
        "executor",
        "late result ignored (already settled)",
        ("operation_id", "late_status", "ledger_status"),
        75,
    ),
    AuditKind.RECONCILED: (
        "reconciler",
        "reconciled from the downstream system: {status}",
        ("operation_id", "status", "code", "attempts"),
        80,
    ),
    AuditKind.ESCALATED: (
        "reconciler",
        "escalated to humans: reconciliation budget spent",
        ("operation_id", "attempts"),
        80,
    ),
    AuditKind.RESOLVED_BY_HUMAN: (
        "reconciler",
        "resolved by a human",
        ("operation_id", "applied", "reference", "by", "by_tenant"),
        85,
    ),
}


class _Blank(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def log_event(row: Mapping[str, Any]) -> Event:
    """One `audit_log` row (id, at, tenant, kind, detail)."""
    detail = row["detail"] if isinstance(row["detail"], dict) else {}
    source = f"audit_log #{row['id']}"
    known = _LOG_EVENTS.get(row["kind"])
    if known is None:
        return Event(
            at=row["at"],
            stage="?",
            what=row["kind"],
            source=source,
            facts=_facts(**{k: v for k, v in detail.items() if isinstance(k, str)}),
        )
    stage, template, names, rank = known
    shown = {k: "" if v is None else v for k, v in detail.items()}
    what = template.format_map(_Blank(shown))
    return Event(
        at=row["at"],
        stage=stage,
        what=what,
        source=source,
        facts=_log_facts(detail, *names),
        rank=rank,
    )


# -- the command ledger -----------------------------------------------------------------


def ledger_events(row: Mapping[str, Any], call_id: str) -> tuple[Event, ...]:
    """The ledger entry: when it was claimed, and where it stands now (attempts,
    reconciliation checks, escalation)."""
    operation = row["operation_id"]
    first = (
        None if row["call_id"] == call_id else f"{row['call_id']} (this call was answered from it)"
    )
    claimed = Event(
        at=row["created_at"],
        stage="executor",
        what="ledger entry claimed: execution starts",
        source="command_ledger",
        facts=_facts(
            operation_id=operation,
            first_run_by=first,
            fingerprint=_short(row["fingerprint"]),
        ),
        rank=60,
    )
    outcome = row.get("outcome") if isinstance(row.get("outcome"), dict) else {}
    error = (outcome or {}).get("error") or {}
    state = Event(
        at=row["updated_at"],
        stage="executor" if not row.get("reconcile_attempts") else "reconciler",
        what=f"ledger now: {row['status']}",
        source="command_ledger",
        facts=_facts(
            operation_id=operation,
            ledger_attempts=row.get("attempts"),
            reconcile_checks=row.get("reconcile_attempts") or None,
            next_check_at=row.get("next_check_at"),
            escalated_at=row.get("escalated_at"),
            code=error.get("code"),
            effect=row.get("effect"),
        ),
        rank=95,
    )
    return (claimed, state)


def build_story(
    call_id: str,
    *,
    records: Iterable[Mapping[str, Any]],
    log: Iterable[Mapping[str, Any]],
    ledger: Iterable[Mapping[str, Any]],
) -> Story:
    records = list(records)
    events = [record_event(r) for r in records]
    events.extend(log_event(r) for r in log)
    for row in ledger:
        events.extend(ledger_events(row, call_id))
    # Kafka timestamps have millisecond resolution, PostgreSQL's microsecond: compared at the
    # coarser one, events of the same millisecond are told apart by pipeline order.
    events.sort(key=lambda e: (e.at.replace(microsecond=e.at.microsecond // 1000 * 1000), e.rank))
    tenant = next((r["tenant"] for r in records if r.get("tenant")), None)
    tool = next((r["tool"] for r in records if r.get("tool")), None)
    finals = [
        r["status"]
        for r in records
        if r["stream"] == "outcomes" and r.get("status") and r["status"] != Status.AWAITING_APPROVAL
    ]
    return Story(
        call_id=call_id,
        tenant=tenant,
        tool=tool,
        final=finals[-1] if finals else None,
        events=tuple(events),
    )


# -- text ---------------------------------------------------------------------------------

_TIME = 23  # "2026-11-29 15:40:01.123"
_STAGE = 10
_WHAT = 52


def _time(at: datetime) -> str:
    at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}"


def render(story: Story) -> str:
    """Aligned text: one line per event (time, stage, what happened, where it is recorded),
    then its key facts, one per line, indented under it."""
    lines = [
        f"call {story.call_id}   tenant {story.tenant or '?'}   tool {story.tool or '?'}   "
        f"final outcome: {story.final or 'none yet'}",
        f"{len(story.events)} events, oldest first; times in UTC",
        "",
        f"{'TIME':{_TIME}}  {'STAGE':{_STAGE}}  {'WHAT HAPPENED':{_WHAT}}  RECORDED IN",
    ]
    indent = " " * (_TIME + 2 + _STAGE + 2 + 4)
    for event in story.events:
        lines.append(
            f"{_time(event.at):{_TIME}}  {event.stage:{_STAGE}}  {event.what:{_WHAT}}  "
            f"{event.source}"
        )
        width = max((len(k) for k, _ in event.facts), default=0)
        lines.extend(f"{indent}{key:{width}}  {value}" for key, value in event.facts)
    return "\n".join(lines)
