"""Pure shaping of what the dashboard reads: filters, time buckets, percentiles, the approval
inbox, feed items. Values in, frozen values or JSON-ready dicts out; no I/O here."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import ValidationError

from approvals.pending import is_pending, pending_order
from commands.budgets import Budget, BudgetStanding, resets_at, window_of
from schemas.envelopes import (
    CALL_ID_PATTERN,
    TENANT_PATTERN,
    ApprovalRequest,
    Status,
)
from schemas.errors import (
    AWAITING_CONFIRMATION_MESSAGE,
    ApprovalExpired,
    ErrorCode,
    InvalidArguments,
    ResourceNotFound,
)
from schemas.vocabulary import AuditKind, LedgerStatus

# date_bin's origin in the SQL: buckets are aligned to it, so a bucket has one start for
# everyone.
BUCKET_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)

# Window (seconds) → bucket width (seconds): about 30 to 72 buckets per chart.
WINDOWS: Mapping[int, int] = {
    15 * 60: 30,
    60 * 60: 60,
    6 * 3600: 300,
    24 * 3600: 1800,
}
DEFAULT_WINDOW = 60 * 60

# Stages in pipeline order, with what each span measures (shown as the row's hint).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("validate", "Validate", "calls.proposed → calls.validated"),
    ("authorize", "Authorize", "calls.validated → calls.authorized (a read: its command)"),
    ("approve_commit", "Approve & commit", "calls.authorized → commands.committed (human wait)"),
    ("execute", "Execute", "commands.committed → terminal outcome"),
    ("end_to_end", "End to end", "outcome at - proposed_at"),
)

# How far back the inbox looks for requests (tools may set long approval TTLs).
INBOX_HORIZON = timedelta(days=1)

_STATUSES = {s.value for s in Status}
_CODES = {c.value for c in ErrorCode}
_TOOL_MAX = 128


@dataclass(frozen=True, kw_only=True)
class Filters:
    """What the person looking at the dashboard narrowed it to."""

    window_seconds: int = DEFAULT_WINDOW
    tenant: str | None = None
    tool: str | None = None
    status: str | None = None
    error_code: str | None = None

    @property
    def bucket_seconds(self) -> int:
        return WINDOWS[self.window_seconds]

    def params(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "tool": self.tool,
            "status": self.status,
            "error_code": self.error_code,
        }


def filters_from(query: Mapping[str, str]) -> Filters:
    """Filters from a query string; an unknown value is `invalid_arguments`, never ignored."""

    def text(name: str) -> str | None:
        value = query.get(name, "").strip()
        return value or None

    window_text = text("window")
    try:
        window = int(window_text) if window_text else DEFAULT_WINDOW
    except ValueError:
        window = -1
    if window not in WINDOWS:
        raise InvalidArguments(f"window must be one of {sorted(WINDOWS)} seconds")
    tenant, tool, status, code = text("tenant"), text("tool"), text("status"), text("error_code")
    if tenant is not None and not re.fullmatch(TENANT_PATTERN.strip("^$"), tenant):
        raise InvalidArguments("tenant is not a tenant id")
    if tool is not None and len(tool) > _TOOL_MAX:
        raise InvalidArguments("tool name too long")
    if status is not None and status not in _STATUSES:
        raise InvalidArguments("status is not an outcome status")
    if code is not None and code not in _CODES:
        raise InvalidArguments("error_code is not an error code")
    return Filters(window_seconds=window, tenant=tenant, tool=tool, status=status, error_code=code)


def valid_call_id(call_id: str) -> bool:
    return re.fullmatch(CALL_ID_PATTERN.strip("^$"), call_id) is not None


# ---------------------------------------------------------------- time series


def bucket_start(at: datetime, bucket_seconds: int) -> datetime:
    """The start of the bucket holding ``at`` (as PostgreSQL's date_bin with our origin)."""
    elapsed = (at - BUCKET_ORIGIN).total_seconds()
    return BUCKET_ORIGIN + timedelta(seconds=math.floor(elapsed / bucket_seconds) * bucket_seconds)


def series_since(now: datetime, filters: Filters) -> datetime:
    """The first bucket's start: whole buckets covering the window, the current one last."""
    count = filters.window_seconds // filters.bucket_seconds
    return bucket_start(now, filters.bucket_seconds) - timedelta(
        seconds=(count - 1) * filters.bucket_seconds
    )


def fill_series(
    rows: Iterable[Mapping[str, Any]], *, since: datetime, bucket_seconds: int, count: int
) -> list[dict[str, Any]]:
    """Every bucket from ``since`` on, with its counts per status (empty buckets included)."""
    width = timedelta(seconds=bucket_seconds)
    buckets: list[dict[str, Any]] = [
        {"at": iso(since + i * width), "counts": {}} for i in range(count)
    ]
    for row in rows:
        index = int((row["bucket"] - since) / width)
        if 0 <= index < count and row["status"]:
            counts = buckets[index]["counts"]
            counts[row["status"]] = counts.get(row["status"], 0) + int(row["n"])
    return buckets


# ---------------------------------------------------------------- counts


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    totals: dict[str, int]
    codes: dict[str, int]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.totals.values())


def breakdown(rows: Iterable[Mapping[str, Any]]) -> Breakdown:
    """Counts per status and error code, overall and per (tenant, tool), busiest first."""
    totals: dict[str, int] = {}
    codes: dict[str, int] = {}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        n = int(row["n"])
        status, code = row["status"] or "?", row["error_code"]
        totals[status] = totals.get(status, 0) + n
        group = groups.setdefault(
            (row["tenant"] or "", row["tool"] or ""),
            {"tenant": row["tenant"] or None, "tool": row["tool"], "total": 0, "by_status": {}},
        )
        group["total"] += n
        group["by_status"][status] = group["by_status"].get(status, 0) + n
        if code:
            codes[code] = codes.get(code, 0) + n
            by_code = group.setdefault("by_code", {})
            by_code[code] = by_code.get(code, 0) + n
    ordered = sorted(groups.values(), key=lambda g: (-g["total"], g["tenant"] or "", g["tool"]))
    for group in ordered:
        group.setdefault("by_code", {})
    return Breakdown(totals=totals, codes=codes, rows=ordered)


def facets(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The values the filters can take, from what was seen in the window."""
    seen: dict[str, set[str]] = {
        "tenant": set(),
        "tool": set(),
        "status": set(),
        "error_code": set(),
    }
    for row in rows:
        for name, values in seen.items():
            if row.get(name):
                values.add(str(row[name]))
    return {name: sorted(values) for name, values in seen.items()}


# ---------------------------------------------------------------- latency


def latency_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per stage in pipeline order; stages without data have n = 0 and no numbers."""
    found = {row["stage"]: row for row in rows}
    table = []
    for key, label, hint in STAGES:
        row = found.get(key)
        table.append(
            {
                "stage": key,
                "label": label,
                "hint": hint,
                "n": int(row["n"]) if row else 0,
                **{p: _ms(row[p]) if row else None for p in ("p50", "p95", "p99")},
            }
        )
    return table


def _ms(value: Any) -> float | None:
    if value is None:
        return None
    return round(max(float(value), 0.0), 1)


# ---------------------------------------------------------------- approval inbox


@dataclass(frozen=True, kw_only=True)
class PendingApproval:
    request: ApprovalRequest
    requested_at: datetime
    decision: str | None  # the latest decision published for it, while no outcome followed
    decision_at: datetime | None
    currency: str | None = None  # of the amounts in its arguments, when known

    def with_currency(self, currency: str | None) -> PendingApproval:
        return PendingApproval(
            request=self.request,
            requested_at=self.requested_at,
            decision=self.decision,
            decision_at=self.decision_at,
            currency=currency,
        )

    def seconds_left(self, now: datetime) -> float:
        return max((self.request.expires_at - now).total_seconds(), 0.0)

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            **self.request.model_dump(mode="json"),
            "preview": list(preview_with_money(self.request, self.currency)),
            "requested_at": iso(self.requested_at),
            "seconds_left": round(self.seconds_left(now), 1),
            "decision": self.decision,
            "decision_at": iso(self.decision_at) if self.decision_at else None,
        }


def pending_requests(
    rows: Iterable[Mapping[str, Any]], *, now: datetime, tenant: str | None
) -> list[PendingApproval]:
    """Requests still waiting for a human: readable, of ``tenant`` (any when None), not
    expired, newest request per call; soonest to expire first. Rows come from
    ``approval_requests.sql`` (calls with a terminal outcome are already left out)."""
    newest: dict[str, PendingApproval] = {}
    for row in rows:
        try:
            request = ApprovalRequest.model_validate(row["record"])
        except ValidationError:
            continue  # not a request we can show or bind a decision to
        if not is_pending(request, now=now, tenant=tenant):
            continue
        item = PendingApproval(
            request=request,
            requested_at=row["record_at"],
            decision=row.get("decision"),
            decision_at=row.get("decision_at"),
        )
        known = newest.get(request.call_id)
        if known is None or item.requested_at >= known.requested_at:
            newest[request.call_id] = item
    return sorted(newest.values(), key=lambda p: pending_order(p.request))


def request_to_decide(
    rows: Iterable[Mapping[str, Any]], *, call_id: str, tenant: str, now: datetime
) -> ApprovalRequest:
    """The pending request a decision is bound to: the newest readable one of this call in
    the approver's tenant. Absent and other tenants' look the same (`not_found`); a request
    whose time is up is `approval_expired`."""
    newest: tuple[datetime, ApprovalRequest] | None = None
    for row in rows:
        try:
            request = ApprovalRequest.model_validate(row["record"])
        except ValidationError:
            continue
        if request.call_id != call_id or request.tenant != tenant:
            continue
        if newest is None or row["record_at"] >= newest[0]:
            newest = (row["record_at"], request)
    if newest is None:
        raise ResourceNotFound("No pending request with this id (it may have been decided).")
    if newest[1].expires_at <= now:
        raise ApprovalExpired("This request expired; nobody can decide it any more.")
    return newest[1]


# ---------------------------------------------------------------- feed

# A waiting call whose resource's owner may confirm it tells the agent it "waits for the
# customer's confirmation" (what the agent should ask its user for). Staff read the feed: for
# them the request is in the inbox as well, and an approver's decision ends it just as the
# customer's confirmation does (docs/approvals.md), so the feed names both.
FEED_AWAITING_CONFIRMATION = "Waits for the customer's confirmation or an approver's decision."


def feed_item(row: Mapping[str, Any]) -> dict[str, Any]:
    """One feed line: an outcome, or a published approval decision."""
    record = row["record"] if isinstance(row["record"], dict) else {}
    base = {
        "id": f"{row['stream']}:{row['kafka_partition']}:{row['kafka_offset']}",
        "at": iso(row["record_at"]),
        "call_id": row["call_id"],
        "tenant": row["tenant"],
        "tool": row["tool"],
    }
    if row["stream"] == "approvals.decided":
        decision = record.get("decision")
        # v2 (signed) decisions name the approver in `decided_by` (the join refuses a record
        # whose copy differs from the signed statement); v1 records carried a token the sink
        # masked, keeping the identity it proved.
        proved = record.get("approver")
        approver: dict[str, Any] = proved if isinstance(proved, dict) else {}
        if isinstance(record.get("decided_by"), str):
            approver = {"sub": record["decided_by"], "verified": True}
        return {
            **base,
            "kind": "decision",
            "status": f"decision:{decision}" if isinstance(decision, str) else "decision",
            "decision": decision if isinstance(decision, str) else None,
            "reason": _text(record.get("reason")),
            "approver": _text(approver.get("sub")) if approver.get("verified") else None,
            "stage": "approve",
            "error_code": None,
            "message": None,
            "detail": None,
        }
    error = record.get("error") if isinstance(record.get("error"), dict) else None
    approval = record.get("approval") if isinstance(record.get("approval"), dict) else None
    return {
        **base,
        "kind": "outcome",
        "status": row["status"],
        "stage": _text(record.get("stage")),
        "error_code": row["error_code"],
        "message": _feed_message(row["status"], error),
        "resource_id": _text(record.get("resource_id")),
        "operation_id": _text(record.get("operation_id")),
        "approver": _text(approval.get("approver")) if approval else None,
        "detail": _detail(record.get("result")),
    }


def _feed_message(status: Any, error: Mapping[str, Any] | None) -> str | None:
    if error is None:
        return None
    message = error.get("message")
    if status == "awaiting_approval" and message == AWAITING_CONFIRMATION_MESSAGE:
        return FEED_AWAITING_CONFIRMATION
    return _text(message)


def _detail(result: Any) -> str | None:
    """A short, human summary of a handler's result (amounts and ids, not the whole object)."""
    if not isinstance(result, dict):
        return None

    def shown(key: str) -> str | None:
        value = result.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)[:80]
        return None

    parts = [v for v in (shown("refund_id"), shown("payment_id")) if v]
    amount = result.get("amount_minor")
    if isinstance(amount, int) and not isinstance(amount, bool):
        parts.append(money(amount, shown("currency")))
    return " · ".join(parts) or None


# ISO 4217 minor-unit exponents that are not 2 (amounts travel in minor units).
_EXPONENTS = {"JPY": 0, "KRW": 0, "VND": 0, "CLP": 0, "ISK": 0, "UGX": 0, "XAF": 0, "XOF": 0}
_EXPONENTS |= {"BHD": 3, "JOD": 3, "KWD": 3, "OMR": 3, "TND": 3}


def money(amount_minor: int, currency: str | None) -> str:
    """An amount in minor units as people read it: 1250 EUR → "12.50 EUR"."""
    if currency is None:
        return f"{amount_minor} (minor units)"
    exponent = _EXPONENTS.get(currency.upper(), 2)
    sign = "-" if amount_minor < 0 else ""
    units, minor = divmod(abs(amount_minor), 10**exponent)
    shown = f"{units:,}" + (f".{minor:0{exponent}d}" if exponent else "")
    return f"{sign}{shown} {currency}"


def currency_of(arguments: Mapping[str, Any], facts: Mapping[str, Any] | None) -> str | None:
    """The currency of a call's amounts: its own ``currency`` argument, else the ``currency``
    fact of the resource it acts on (a refund's payment)."""
    for source in (arguments, facts or {}):
        value = source.get("currency")
        if isinstance(value, str) and 0 < len(value) <= 8:
            return value
    return None


def preview_with_money(request: ApprovalRequest, currency: str | None) -> tuple[str, ...]:
    """The request's preview lines with amounts in minor units (``<name>_minor``) shown as
    the feed shows them, by the same formatter: ``amount_minor: 5`` → ``amount: 0.05 EUR``."""
    lines = []
    for line in request.preview:
        key, _, _ = line.partition(": ")
        value = request.arguments.get(key)
        if key.endswith("_minor") and isinstance(value, int) and not isinstance(value, bool):
            lines.append(f"{key.removesuffix('_minor')}: {money(value, currency)}")
        else:
            lines.append(line)
    return tuple(lines)


def _text(value: Any, limit: int = 300) -> str | None:
    return value[:limit] if isinstance(value, str) else None


# ---------------------------------------------------------------- operations


def operations(
    ledger_rows: Iterable[Mapping[str, Any]], history_rows: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Unknown and escalated operations, each with its reconciliation history."""
    history: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in history_rows:
        detail = row["detail"] if isinstance(row["detail"], dict) else {}
        history.setdefault((row["tenant"], row["call_id"]), []).append(
            {
                "at": iso(row["at"]),
                "kind": row["kind"],
                "summary": _history_summary(row["kind"], detail),
            }
        )
    items = []
    for row in ledger_rows:
        if row["status"] == LedgerStatus.UNKNOWN:
            state = "escalated" if row["escalated_at"] else "reconciling"
        else:
            state = "settled"
        items.append(
            {
                "tenant": row["tenant"],
                "operation_id": row["operation_id"],
                "call_id": row["call_id"],
                "tool": row["tool"],
                "state": state,
                "ledger_status": row["status"],
                "error_code": row.get("error_code"),
                "checks": int(row["reconcile_attempts"]),
                "next_check_at": iso(row["next_check_at"]) if row["next_check_at"] else None,
                "escalated_at": iso(row["escalated_at"]) if row["escalated_at"] else None,
                "updated_at": iso(row["updated_at"]),
                "history": history.get((row["tenant"], row["call_id"]), []),
            }
        )
    return items


def _history_summary(kind: str, detail: Mapping[str, Any]) -> str:
    def get(key: str) -> str | None:
        value = detail.get(key)
        return None if value is None else str(value)[:120]

    if kind in (AuditKind.EXECUTED, AuditKind.READ):
        return " ".join(
            p for p in (get("status"), f"({get('code')})" if get("code") else None) if p
        )
    if kind == AuditKind.RECONCILED:
        return f"{get('status')} after {get('attempts')} check(s)" + (
            f" ({get('code')})" if get("code") else ""
        )
    if kind == AuditKind.ESCALATED:
        return f"escalated to humans after {get('attempts')} check(s)"
    if kind == AuditKind.RESOLVED_BY_HUMAN:
        verdict = "applied" if detail.get("applied") else "not applied"
        ref = f", ref {get('reference')}" if get("reference") else ""
        return f"{verdict} by {get('by')}{ref}"
    return ", ".join(f"{k}={str(v)[:60]}" for k, v in list(detail.items())[:4])


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- the budgets panel (docs/budgets.md) -------------------------------------------------------


def _local_time(budget: Budget, at: datetime | None) -> str | None:
    """A reset time in the budget's own time zone (where its days and weeks are counted)."""
    if at is None:
        return None
    return at.astimezone(ZoneInfo(budget.time_zone)).isoformat(timespec="seconds")


def budgets_panel(
    budgets: Iterable[Budget], rows: Iterable[Mapping[str, Any]], *, now: datetime
) -> list[dict[str, Any]]:
    """Each budget in force for the signed-in tenant (``budgets``: the set's, resolved with
    `commands.budgets.budgets_for_tenant`, its own replacing the default) with its
    declaration, whether it is the tenant's own, and, per scope with usage in the current
    window, used (consumed plus reserved for unsettled calls), reserved, cap, what is left,
    a whole percent for the bar and the reset time; a budget nothing was used of shows its
    next reset."""
    by_budget: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_budget.setdefault(row["budget"], []).append(row)
    shown = []
    for budget in budgets:
        span = window_of(budget, now)
        scopes = []
        for row in by_budget.get(budget.name, []):
            consumed, reserved = int(row["consumed"]), int(row["reserved"])
            used = consumed + reserved
            standing = BudgetStanding(
                name=budget.name, used=used, reserved=reserved, cap=budget.cap
            )
            scopes.append(
                {
                    "scope": row["scope_key"],
                    "used": used,
                    "consumed": consumed,
                    "reserved": reserved,
                    "left": max(budget.cap - used, 0),
                    "percent_used": min(standing.percent_used, 100),
                    "resets_at": _local_time(budget, resets_at(budget, span, row["oldest"])),
                }
            )
        scopes.sort(key=lambda s: (-s["used"], s["scope"]))
        shown.append(
            {
                "name": budget.name,
                # True: the tenant's own budget (`tenant =`), replacing any default.
                "tenant_specific": budget.tenant is not None,
                "measure": budget.measure,
                "unit": budget.argument or "calls",
                "cap": budget.cap,
                "window": (
                    f"rolling {budget.rolling_hours} h"
                    if budget.window == "rolling"
                    else f"{budget.window} in {budget.time_zone}"
                ),
                "window_key": span.key,
                "tools": list(budget.tools),
                "per": ["tenant", *(p for p in budget.per if p != "tenant")],
                "resets_at": _local_time(budget, span.resets_at),
                "scopes": scopes,
            }
        )
    return shown
