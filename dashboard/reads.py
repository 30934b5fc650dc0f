"""What the dashboard reads from PostgreSQL: the audit sink's `audit_records` (every record of
every pipeline topic, under this deployment's topic prefix), the command ledger and the audit
log. Read-only connections (`runtime.clients.pg_pool(..., read_only=True)`): the dashboard's
one write is a signed decision on Kafka."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from commands.budgets import Budget, window_of
from commands.catalog import Catalog
from commands.sql import named_query
from dashboard import shaping
from dashboard.shaping import Filters, PendingApproval
from schemas.envelopes import Actor, ApprovalRequest
from schemas.errors import StorageUnavailable

_PKG = "dashboard"
# Scopes shown per request on the budgets panel (a budget per end user can have many).
BUDGET_SCOPES_LIMIT = 500
FEED_LIMIT = 200
OPERATIONS_LIMIT = 50
# Settled operations stay in the operations panel this long after their last change.
SETTLED_VISIBLE = timedelta(days=1)
# Currencies of pending requests remembered (a request's resource does not change currency).
CURRENCIES_KEPT = 10_000


class DashboardReads:
    def __init__(
        self, pool: AsyncConnectionPool[Any], *, prefix: str, catalog: Catalog | None = None
    ) -> None:
        self._pool = pool
        self._prefix = prefix
        self._catalog = catalog
        self._currencies: dict[str, str | None] = {}

    async def _rows(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        try:
            async with self._pool.connection(timeout=5) as conn, conn.cursor() as cur:
                await cur.execute(named_query(_PKG, name), {"prefix": self._prefix, **params})
                return [dict(r) for r in await cur.fetchall()]
        except pg_errors.UndefinedTable as exc:
            raise StorageUnavailable(
                "The audit tables are missing: run `ratifier migrate` and the audit sink."
            ) from exc
        except (psycopg.Error, TimeoutError) as exc:
            raise StorageUnavailable("PostgreSQL is not reachable.") from exc

    async def overview(self, filters: Filters, now: datetime) -> dict[str, Any]:
        """KPIs, the outcome series, counts per tenant and tool, latency, filter choices."""
        since = shaping.series_since(now, filters)
        window_start = now - timedelta(seconds=filters.window_seconds)
        params = {**filters.params(), "since": window_start}
        series_rows = await self._rows(
            "outcome_series",
            {**params, "since": since, "bucket_seconds": filters.bucket_seconds},
        )
        counted = shaping.breakdown(await self._rows("outcome_breakdown", params))
        unfiltered = await self._rows(
            "outcome_breakdown",
            {**Filters(window_seconds=filters.window_seconds).params(), "since": window_start},
        )
        latency = shaping.latency_table(await self._rows("stage_latency", params))
        pending = await self.pending(filters.tenant, now)
        open_ops = await self.operations(filters.tenant, now, with_history=False)
        last = await self._rows("last_outcome", {})
        return {
            "prefix": self._prefix,
            "now": shaping.iso(now),
            "window_seconds": filters.window_seconds,
            "bucket_seconds": filters.bucket_seconds,
            "last_outcome_at": shaping.iso(last[0]["record_at"]) if last else None,
            "kpis": {
                "outcomes": counted.total,
                "by_status": counted.totals,
                "by_code": counted.codes,
                "pending_approvals": len(pending),
                "reconciling": sum(1 for o in open_ops if o["state"] == "reconciling"),
                "escalated": sum(1 for o in open_ops if o["state"] == "escalated"),
            },
            "series": shaping.fill_series(
                series_rows,
                since=since,
                bucket_seconds=filters.bucket_seconds,
                count=filters.window_seconds // filters.bucket_seconds,
            ),
            "breakdown": counted.rows,
            "latency": latency,
            "facets": shaping.facets(unfiltered),
        }

    async def feed(self, filters: Filters, now: datetime, limit: int = FEED_LIMIT) -> list[Any]:
        rows = await self._rows(
            "feed",
            {
                **filters.params(),
                "since": now - timedelta(seconds=filters.window_seconds),
                "limit": limit,
            },
        )
        return [shaping.feed_item(r) for r in rows]

    async def pending(self, tenant: str | None, now: datetime) -> list[PendingApproval]:
        """Pending approval requests of ``tenant`` (None: every tenant, for counting)."""
        rows = await self._rows(
            "approval_requests", {"tenant": tenant, "since": now - shaping.INBOX_HORIZON}
        )
        pending = shaping.pending_requests(rows, now=now, tenant=tenant)
        if tenant is None:
            return pending  # counted, not shown
        return [p.with_currency(await self._currency(p.request)) for p in pending]

    async def _currency(self, request: ApprovalRequest) -> str | None:
        """The currency of the request's amounts (shown like the feed's): its argument, or
        the resource's fact, loaded by the tool's own loader with the tenant in its WHERE."""
        if request.call_id in self._currencies:
            return self._currencies[request.call_id]
        found = shaping.currency_of(request.arguments, None)
        tool = self._catalog.get(request.tool) if self._catalog is not None else None
        if found is None and tool is not None and tool.load is not None:
            try:
                arguments = tool.arguments.model_validate(request.arguments)
            except ValidationError:
                arguments = None  # masked arguments that no longer validate: no lookup
            if arguments is not None:
                actor = Actor(sub=request.requested_by, tenant=request.tenant)
                try:
                    async with self._pool.connection(timeout=5) as conn:
                        resource = await tool.load(conn, actor, arguments, False)
                except (psycopg.Error, TimeoutError):
                    return None  # shown in minor units this time; asked again next time
                found = shaping.currency_of(
                    request.arguments, resource.attributes if resource else None
                )
        if len(self._currencies) >= CURRENCIES_KEPT:
            self._currencies.clear()
        self._currencies[request.call_id] = found
        return found

    async def request_to_decide(self, tenant: str, call_id: str, now: datetime) -> ApprovalRequest:
        rows = await self._rows(
            "approval_requests", {"tenant": tenant, "since": now - shaping.INBOX_HORIZON}
        )
        return shaping.request_to_decide(rows, call_id=call_id, tenant=tenant, now=now)

    async def call_outcome(self, tenant: str, call_id: str) -> str | None:
        """The call's terminal outcome status, once the audit sink recorded one."""
        rows = await self._rows("call_outcome", {"tenant": tenant, "call_id": call_id})
        return str(rows[0]["status"]) if rows else None

    async def budget_usage(
        self, budgets: Sequence[Budget], *, tenant: str, now: datetime
    ) -> list[dict[str, Any]]:
        """The current window's usage of each of ``budgets``, per scope of ``tenant`` (one
        read-only query, the tenant in its WHERE)."""
        if not budgets:
            return []
        spans = [window_of(b, now) for b in budgets]
        return await self._rows(
            "budget_usage",
            {
                "tenant": tenant,
                "budgets": [b.name for b in budgets],
                "window_keys": [s.key for s in spans],
                "since": [s.since for s in spans],
                "limit": BUDGET_SCOPES_LIMIT,
            },
        )

    async def operations(
        self, tenant: str | None, now: datetime, *, with_history: bool = True
    ) -> list[dict[str, Any]]:
        ledger = await self._rows(
            "open_operations",
            {"tenant": tenant, "since": now - SETTLED_VISIBLE, "limit": OPERATIONS_LIMIT},
        )
        history: list[dict[str, Any]] = []
        if ledger and with_history:
            history = await self._rows(
                "operation_history",
                {
                    "tenants": [r["tenant"] for r in ledger],
                    "call_ids": [r["call_id"] for r in ledger],
                },
            )
        return shaping.operations(ledger, history)
