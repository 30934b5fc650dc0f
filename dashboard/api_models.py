"""The shapes of the dashboard's JSON API (dashboard/server.py), as frozen pydantic models:
what each /api route accepts and answers. The OpenAPI document of the dashboard
(`ratifier/openapi.py`, ``schemas/json/openapi-dashboard.json``) takes its schemas from here;
the kill switch's answers are serialized through them, and tests check the other handlers'
real answers against them. Times are ISO 8601 text (UTC with ``Z``, or a budget's own zone).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from approvals.api_models import Body
from commands.limits import Limit
from runtime.breaker_machine import BreakerState
from schemas.envelopes import FREEZE_SCOPE_PATTERN, ApprovalRequest, FreezeRecord, ShortText, Tenant

# A time as the dashboard writes it (`dashboard.shaping.iso`, or a budget's local time).
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


# -- /api/session ------------------------------------------------------------------------------


class Session(Body):
    """Who the token names (any verified context token signs in) and what it may do on the
    dashboard; the page shows each panel accordingly."""

    sub: str
    tenant: str
    roles: list[str]
    can_approve: bool = Field(
        description="the approver role: the tenant's pending requests, and deciding them"
    )
    can_freeze: bool = Field(
        description="the operator policies let it freeze and unfreeze its tenant's scopes"
    )
    can_freeze_fleet: bool = Field(
        description="the operator policies let it freeze and unfreeze `writes:*` (fleet_operator)"
    )


# -- /api/approvals ----------------------------------------------------------------------------


class PendingShown(ApprovalRequest):
    """A pending request as the inbox shows it: the `approvals.requested` record (its
    ``preview`` with amounts in currency units), when it was requested, the seconds left
    before it expires, and the latest decision published for it while no outcome followed."""

    requested_at: Timestamp
    seconds_left: float = Field(ge=0)
    decision: str | None
    decision_at: Timestamp | None


class InboxAnswer(Body):
    tenant: str
    now: Timestamp
    pending: list[PendingShown]


# -- /api/overview, /api/feed, /api/operations -------------------------------------------------


class Kpis(Body):
    outcomes: int
    by_status: dict[str, int]
    by_code: dict[str, int]
    pending_approvals: int
    reconciling: int
    escalated: int


class SeriesBucket(Body):
    at: Timestamp
    counts: dict[str, int] = Field(description="outcomes per status in the bucket")


class BreakdownRow(Body):
    tenant: str | None
    tool: str | None
    total: int
    by_status: dict[str, int]
    by_code: dict[str, int]


class LatencyRow(Body):
    stage: Literal["validate", "authorize", "approve_commit", "execute", "end_to_end"]
    label: str
    hint: str
    n: int
    p50: float | None = Field(description="milliseconds")
    p95: float | None
    p99: float | None


class Facets(Body):
    tenant: list[str]
    tool: list[str]
    status: list[str]
    error_code: list[str]


class Overview(Body):
    """Key figures, the outcome series, counts per tenant and tool, latency, filter choices."""

    prefix: str
    now: Timestamp
    window_seconds: int
    bucket_seconds: int
    last_outcome_at: Timestamp | None
    kpis: Kpis
    series: list[SeriesBucket]
    breakdown: list[BreakdownRow]
    latency: list[LatencyRow]
    facets: Facets


class OutcomeItem(Body):
    """A feed line for an outcome."""

    kind: Literal["outcome"]
    id: str
    at: Timestamp
    call_id: str | None
    tenant: str | None
    tool: str | None
    status: str | None
    stage: str | None
    error_code: str | None
    message: str | None
    resource_id: str | None
    operation_id: str | None
    approver: str | None
    detail: str | None


class DecisionItem(Body):
    """A feed line for a published approval decision."""

    kind: Literal["decision"]
    id: str
    at: Timestamp
    call_id: str | None
    tenant: str | None
    tool: str | None
    status: str
    decision: str | None
    reason: str | None
    approver: str | None
    stage: Literal["approve"]
    error_code: None
    message: None
    detail: None


class FeedAnswer(Body):
    items: list[Annotated[OutcomeItem | DecisionItem, Field(discriminator="kind")]]


class HistoryEntry(Body):
    at: Timestamp
    kind: str
    summary: str


class OperationShown(Body):
    """An unknown, escalated or recently settled operation with its history."""

    tenant: str
    operation_id: str
    call_id: str
    tool: str
    state: Literal["reconciling", "escalated", "settled"]
    ledger_status: str
    error_code: str | None
    checks: int
    next_check_at: Timestamp | None
    escalated_at: Timestamp | None
    updated_at: Timestamp
    history: list[HistoryEntry]


class OperationsAnswer(Body):
    items: list[OperationShown]


# -- /api/freezes (the kill switch, docs/kill-switch.md) ---------------------------------------


class Freeze(Body):
    """A `controls` record as the API shows it (`schemas.envelopes.FreezeRecord` without
    its ``v``)."""

    scope: Annotated[str, StringConstraints(pattern=FREEZE_SCOPE_PATTERN)]
    frozen: bool
    by: str = Field(min_length=1, max_length=256)
    by_tenant: Tenant | None = None
    reason: ShortText = ""
    at: datetime

    @classmethod
    def of(cls, record: FreezeRecord) -> Freeze:
        return cls.model_validate(record.model_dump(exclude={"v"}))


class FreezesAnswer(Body):
    """The frozen scopes of the token's tenant and the fleet-wide ones."""

    freezes: list[Freeze]


class FreezeRequest(Body):
    """Freeze (``frozen``: true) or unfreeze a scope: `tenant:<t>`, `writes:<t>`, `writes:*`,
    `agent|subject|tool:<t>:<name>`."""

    scope: Annotated[str, StringConstraints(pattern=FREEZE_SCOPE_PATTERN)]
    frozen: bool
    reason: str = ""


class FreezeThrown(Body):
    """202: the `controls` record is published (the broker acknowledged it)."""

    published: Literal[True]
    freeze: Freeze


# -- /api/budgets (docs/budgets.md) ------------------------------------------------------------


class BudgetScopeShown(Body):
    """A scope of the token's tenant with usage in the budget's current window."""

    scope: str
    used: int = Field(description="consumed plus reserved for calls not yet settled")
    consumed: int
    reserved: int
    left: int = Field(ge=0)
    percent_used: int = Field(ge=0, le=100)
    resets_at: Timestamp | None = Field(description="in the budget's time zone")


class BudgetShown(Body):
    """A budget of the policy set in force for the token's tenant
    (`dashboard.shaping.budgets_panel`)."""

    name: str
    tenant_specific: bool = Field(
        description="the tenant's own budget (`tenant =`), replacing any default of its name"
    )
    measure: str
    unit: str = Field(description='the argument summed, or "calls"')
    cap: int
    window: str = Field(description='e.g. "day in Europe/Berlin" or "rolling 24 h"')
    window_key: str
    tools: list[str]
    per: list[str]
    resets_at: Timestamp | None = Field(description="in the budget's time zone")
    scopes: list[BudgetScopeShown]


class BudgetsAnswer(Body):
    tenant: str
    policy_version: str
    budgets: list[BudgetShown]


# -- /api/breakers, /api/limits ----------------------------------------------------------------


class BreakerShown(Body):
    """A downstream's circuit breaker (shared by all executors) and its current window."""

    breaker: str
    state: BreakerState
    since: Timestamp | None
    calls: int
    failures: int
    slow: int


class BreakersAnswer(Body):
    breakers: list[BreakerShown]


class BucketUsage(Body):
    bucket: str
    holds: str = Field(description='e.g. "9.0 tokens left" or "3 in flight"')


class LimitsAnswer(Body):
    """The admission limits in force that apply to the token's tenant, and what its live
    buckets hold."""

    policy_version: str
    limits: list[Limit]
    usage: list[BucketUsage]


# -- health ------------------------------------------------------------------------------------


class DashboardAlive(Body):
    service: Literal["dashboard"]
    alive: bool


class DashboardReady(Body):
    service: Literal["dashboard"]
    ready: bool
    why: str | None
