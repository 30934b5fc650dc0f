"""`ratifier dashboard`: one page and a JSON API on 127.0.0.1, read from PostgreSQL.

    GET  /                                   the page (HTML, CSS and JS shipped in the package)
    GET  /api/overview?window=&tenant=&tool=&status=&error_code=
                                             KPIs, outcome series, counts, latency, filter choices
    GET  /api/feed?…same filters…            newest outcomes and approval decisions
    GET  /api/operations?tenant=             unknown / escalated operations and their history
    GET  /api/session                        who the token names and what it may do here
                                             (Bearer, any verified token)
    GET  /api/approvals                      the approver tenant's pending requests (Bearer)
    POST /api/approvals/{call_id}/decision   {"decision": "approve"|"reject"|"edit",
                                              "reason": "...", "arguments": {...} (edit only)}
                                                                                  (Bearer)
    GET  /api/approvals/{call_id}/decisions/{decision_id}
                                             what the approval-join made of it   (Bearer)
    GET  /api/freezes                        the frozen scopes of the token's tenant and the
                                             fleet-wide ones (Bearer, any verified token)
    POST /api/freezes                        {"scope": "...", "frozen": true|false,
                                              "reason": "..."}: the kill switch (Bearer,
                                              operator rights by Cedar policy)
    GET  /api/budgets                        the budgets of the set in force with the current
                                             window's usage per scope of the token's tenant
                                             (Bearer, any verified token)
    GET  /api/limits                         admission limits in force for the token's tenant
                                             and its live buckets' usage (Bearer)

Besides freezes (`controls` records, docs/kill-switch.md), the only thing it writes is a
signed `approvals.decided` record, published exactly as the approver CLI and HTTP endpoint
do (`approvals.inbox`, `approvals.verdicts`): the approver's token is verified here, the
decision is checked with the join's own rule (a refusal is a typed error and nothing is
published), then, bound to the call, tenant and fingerprint of the request shown, it is
signed with the approval service's key; the token is never published. The answer names the
decision id to follow the join's verdict with. Everything else is read through read-only
sessions.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import psycopg
from aiohttp import web
from aiokafka.errors import KafkaError
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from redis.exceptions import RedisError

from approvals.inbox import HTTP_STATUS, approver_from, decision_body
from approvals.operators import OperatorRights, operator_from, throw_switch, visible_to
from approvals.policy import PolicyRights
from approvals.refusals import error_json
from approvals.rights import APPROVER_ROLE
from approvals.signing import approval_keys
from approvals.verdicts import DecisionDesk, JoinAudit, published
from commands.catalog import Catalog, load_catalog
from commands.freezes import EVERY_TENANT, Scope
from commands.policy import PolicySet
from config.settings import Settings
from dashboard import shaping
from dashboard.api_models import Freeze, FreezesAnswer, FreezeThrown, Session
from dashboard.reads import DashboardReads
from feeds.freezes import FleetFreezes
from feeds.policies import PolicyFeed, local_policies
from runtime.breakers import BreakerStatus, FleetBreakers
from runtime.clients import database_conninfo, pg_pool, redis_client
from runtime.health import health_response
from runtime.identity import ContextKeys, context_keys
from runtime.limit_usage import limit_usage
from schemas.envelopes import Actor
from schemas.errors import (
    InvalidArguments,
    RatifierError,
    ResourceNotFound,
    StorageUnavailable,
)
from telemetry.metrics import count_records, metrics_handler

log = logging.getLogger("ratifier.dashboard")

STATIC_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_READS = web.AppKey("reads", DashboardReads)
_SETTINGS = web.AppKey("settings", Settings)
_KEYS = web.AppKey("keys", ContextKeys)
_DESK = web.AppKey("desk", DecisionDesk)


def _static(name: str) -> bytes:
    return resources.files("dashboard").joinpath("static", name).read_bytes()


def _failure(exc: RatifierError) -> web.Response:
    return web.json_response(error_json(exc), status=HTTP_STATUS.get(exc.code, 400))


@web.middleware
async def _errors_and_headers(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except RatifierError as exc:
        if isinstance(exc, StorageUnavailable):
            log.warning("dashboard: %s (%s)", exc.safe_message, exc.__cause__)
        response = _failure(exc)
    response.headers.update(SECURITY_HEADERS)
    return response


def _approver(request: web.Request) -> tuple[str, Actor]:
    header = request.headers.get("Authorization", "")
    token = header.removeprefix("Bearer ").strip()
    return token, approver_from(token or None, request.app[_KEYS])


def _now() -> datetime:
    return datetime.now(UTC)


async def page(_request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8")


async def static_file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return web.Response(body=_static(name), content_type=STATIC_FILES[name], charset="utf-8")


async def overview(request: web.Request) -> web.Response:
    filters = shaping.filters_from(request.query)
    return web.json_response(await request.app[_READS].overview(filters, _now()))


async def feed(request: web.Request) -> web.Response:
    filters = shaping.filters_from(request.query)
    return web.json_response({"items": await request.app[_READS].feed(filters, _now())})


async def operations(request: web.Request) -> web.Response:
    tenant = shaping.filters_from({"tenant": request.query.get("tenant", "")}).tenant
    items = await request.app[_READS].operations(tenant, _now())
    return web.json_response({"items": items})


async def session(request: web.Request) -> web.Response:
    """Who the token names and what it may do here: any verified token signs in (an
    operator needs no approver role); the page shows each panel by these answers. Approving
    needs the approver role (as `approver_from`); freezing is asked of the operator policies
    for a scope of the token's tenant and for the fleet-wide `writes:*`."""
    actor = _operator(request)
    rights = request.app[_OPERATORS]
    answer = Session(
        sub=actor.sub,
        tenant=actor.tenant,
        roles=list(actor.roles),
        can_approve=APPROVER_ROLE in actor.roles,
        can_freeze=rights.allows(actor, frozen=True, scope=Scope.parse(f"writes:{actor.tenant}")),
        can_freeze_fleet=rights.allows(
            actor, frozen=True, scope=Scope.parse(f"writes:{EVERY_TENANT}")
        ),
    )
    return web.json_response(answer.model_dump(mode="json"))


async def approvals(request: web.Request) -> web.Response:
    _, approver = _approver(request)
    now = _now()
    pending = await request.app[_READS].pending(approver.tenant, now)
    return web.json_response(
        {
            "tenant": approver.tenant,
            "now": shaping.iso(now),
            "pending": [p.to_json(now) for p in pending],
        }
    )


async def decide(request: web.Request) -> web.Response:
    _, approver = _approver(request)
    call_id = request.match_info["call_id"]
    if not shaping.valid_call_id(call_id):
        raise ResourceNotFound()
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidArguments("The body must be JSON.") from exc
    verdict, reason, arguments = decision_body(body)
    found = await request.app[_READS].request_to_decide(approver.tenant, call_id, _now())
    try:
        decision = await request.app[_DESK].decide(
            found, approver=approver, verdict=verdict, reason=reason, arguments=arguments
        )
    except KafkaError as exc:
        raise StorageUnavailable("Kafka is not reachable; nothing was published.") from exc
    count_records("dashboard", f"decision_{verdict.value}")
    log.info(
        "dashboard: %s published for %s by %s@%s",
        verdict.value,
        call_id,
        approver.sub,
        approver.tenant,
    )
    follow = f"/api/approvals/{call_id}/decisions/{decision.decision_id}"
    return web.json_response(published(decision, found, follow), status=202)


async def decision_verdict(request: web.Request) -> web.Response:
    """What the approval-join made of one of the tenant's decisions (the page polls it after
    the approver clicked)."""
    _, approver = _approver(request)
    call_id, decision_id = request.match_info["call_id"], request.match_info["decision_id"]
    if not (shaping.valid_call_id(call_id) and shaping.valid_call_id(decision_id)):
        raise ResourceNotFound()
    outcome = await request.app[_READS].call_outcome(approver.tenant, call_id)
    verdict = await request.app[_DESK].verdict(
        approver.tenant, call_id, decision_id, outcome=outcome
    )
    return web.json_response(verdict.to_json())


# -- the kill switch (docs/kill-switch.md) -----------------------------------------------

_FREEZES = web.AppKey("freezes", FleetFreezes)
_OPERATORS = web.AppKey("operators", OperatorRights)


def _operator(request: web.Request) -> Actor:
    token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return operator_from(token or None, request.app[_KEYS])


async def freezes(request: web.Request) -> web.Response:
    operator = _operator(request)
    view = request.app[_FREEZES]
    try:
        await view.catch_up()
    except KafkaError as exc:
        raise StorageUnavailable("Kafka is not reachable.") from exc
    shown = visible_to(operator, view.current.records())
    answer = FreezesAnswer(freezes=[Freeze.of(r) for r in shown])
    return web.json_response(answer.model_dump(mode="json"))


async def throw(request: web.Request) -> web.Response:
    operator = _operator(request)
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidArguments("The body must be JSON.") from exc
    if not isinstance(body, dict) or not isinstance(body.get("frozen"), bool):
        raise InvalidArguments('The body needs "scope", "frozen" (true or false) and "reason".')
    scope, reason = body.get("scope"), body.get("reason") or ""
    if not isinstance(scope, str) or not isinstance(reason, str):
        raise InvalidArguments("scope and reason must be text.")
    try:
        thrown = await throw_switch(
            request.app[_SETTINGS],
            request.app[_OPERATORS],
            operator,
            scope_text=scope,
            frozen=body["frozen"],
            reason=reason,
        )
    except KafkaError as exc:
        raise StorageUnavailable("Kafka is not reachable; nothing was published.") from exc
    record = thrown.record
    log.warning(
        "dashboard: %s %s by %s@%s: %s",
        "FROZEN" if record.frozen else "unfrozen",
        record.scope,
        operator.sub,
        operator.tenant,
        record.reason,
    )
    thrown_answer = FreezeThrown(published=True, freeze=Freeze.of(record))
    return web.json_response(thrown_answer.model_dump(mode="json"), status=202)


# -- circuit breakers (docs/execution.md, "Circuit breakers") ------------------------------

_BREAKERS = web.AppKey("breakers", FleetBreakers)


def _breaker_json(status: BreakerStatus) -> dict[str, Any]:
    return {
        "breaker": status.breaker,
        "state": status.state.value,
        "since": shaping.iso(status.since) if status.since else None,
        "calls": status.calls,
        "failures": status.failures,
        "slow": status.slow,
    }


async def breakers(request: web.Request) -> web.Response:
    """Every downstream's breaker (shared by all executors) and its window now: operational
    state of the deployment, no tenant's data."""
    try:
        found = await request.app[_BREAKERS].statuses()
    except RedisError as exc:
        raise StorageUnavailable("Redis is not reachable.") from exc
    return web.json_response({"breakers": [_breaker_json(s) for s in found]})


# -- budgets (docs/budgets.md) ---------------------------------------------------------------

# How long the policy set read from the `policies` topic is reused before it is read again.
POLICIES_REFRESH_SECONDS = 10.0


class PoliciesInForce:
    """The set the workers enforce (the newest valid one on the `policies` topic, like
    `ratifier budgets`), re-read at most every `POLICIES_REFRESH_SECONDS`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._feed: PolicyFeed | None = None
        self._read_at: float | None = None

    async def current(self) -> PolicySet:
        now = time.monotonic()
        if self._feed is None:
            self._feed = PolicyFeed(self._settings, local_policies(self._settings))
        if self._read_at is None or now - self._read_at >= POLICIES_REFRESH_SECONDS:
            try:
                await self._feed.catch_up(announce=False)
            except KafkaError as exc:
                if self._read_at is None:
                    raise StorageUnavailable("Kafka is not reachable.") from exc
                log.warning("dashboard: policies not refreshed (%s)", exc)
            else:
                self._read_at = now
        return self._feed.current


_POLICIES = web.AppKey("policies", PoliciesInForce)


async def budgets(request: web.Request) -> web.Response:
    tenant = _operator(request).tenant
    policies = await request.app[_POLICIES].current()
    now = _now()
    in_force = policies.budgets_for(tenant)  # its own budgets replace the defaults
    rows = await request.app[_READS].budget_usage(in_force, tenant=tenant, now=now)
    return web.json_response(
        {
            "tenant": tenant,
            "policy_version": policies.version,
            "budgets": shaping.budgets_panel(in_force, rows, now=now),
        }
    )


# -- admission limits (docs/operations.md, "Admission and limits") ---------------------------

_POLICY_FEED = web.AppKey("policy_feed", PolicyFeed)


async def limits(request: web.Request) -> web.Response:
    """The limits in force that apply to the token's tenant, and its live buckets' usage."""
    operator = _operator(request)
    feed = request.app[_POLICY_FEED]
    try:
        await feed.catch_up(announce=False)
        live = await limit_usage(request.app[_SETTINGS], tenant=operator.tenant)
    except (KafkaError, RedisError, OSError) as exc:
        raise StorageUnavailable("Kafka or Redis is not reachable.") from exc
    declared = feed.current.limits
    rules = [
        limit.model_dump(mode="json", exclude_none=True)
        for limit in declared.limits
        if limit.tenant in (None, operator.tenant)
    ]
    return web.json_response(
        {
            "policy_version": feed.current.version,
            "limits": rules,
            "usage": [{"bucket": bucket, "holds": held} for bucket, held in live],
        }
    )


READY_TIMEOUT_SECONDS = 2.0


def create_app(
    settings: Settings, *, keys: ContextKeys | None = None, catalog: Catalog | None = None
) -> web.Application:
    app = web.Application(middlewares=[_errors_and_headers], client_max_size=256 * 1024)
    pool = pg_pool(
        database_conninfo(settings), max_size=4, dict_rows=True, autocommit=True, read_only=True
    )
    catalog = catalog or load_catalog(settings.catalog)
    app[_READS] = DashboardReads(pool, prefix=settings.topic_prefix, catalog=catalog)
    app[_SETTINGS] = settings
    app[_KEYS] = keys or context_keys(settings)
    app[_FREEZES] = FleetFreezes(settings)
    app[_POLICIES] = PoliciesInForce(settings)
    app[_OPERATORS] = OperatorRights.from_directory()
    app[_DESK] = DecisionDesk(
        settings=settings,
        signing=approval_keys(settings),
        rights=PolicyRights.for_settings(settings, catalog),
        catalog=catalog,
        audit=JoinAudit(pool),
    )
    redis = redis_client(settings)
    app[_BREAKERS] = FleetBreakers(
        redis, prefix=settings.topic_prefix, defaults=settings.breakers, by="dashboard"
    )
    app[_POLICY_FEED] = PolicyFeed(settings, local_policies(settings))

    async def lifecycle(_app: web.Application) -> Any:
        await pool.open(wait=False)
        yield
        await pool.close()
        await app[_FREEZES].close()
        await redis.aclose()

    app.cleanup_ctx.append(lifecycle)

    async def healthz(_request: web.Request) -> web.Response:
        # The dashboard has no loop of its own: answering is being alive.
        return health_response((True, {"service": "dashboard", "alive": True}))

    async def readyz(_request: web.Request) -> web.Response:
        # Ready when PostgreSQL answers (every page and API reads it).
        why = None
        try:
            async with pool.connection(timeout=READY_TIMEOUT_SECONDS) as conn:
                await AsyncConnectionPool.check_connection(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            why = f"database: {type(exc).__name__}"
        body = {"service": "dashboard", "ready": why is None, "why": why}
        return health_response((why is None, body))

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static_file)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/feed", feed)
    app.router.add_get("/api/operations", operations)
    app.router.add_get("/api/session", session)
    app.router.add_get("/api/approvals", approvals)
    app.router.add_post("/api/approvals/{call_id}/decision", decide)
    app.router.add_get("/api/freezes", freezes)
    app.router.add_post("/api/freezes", throw)
    app.router.add_get("/api/budgets", budgets)
    app.router.add_get("/api/approvals/{call_id}/decisions/{decision_id}", decision_verdict)
    app.router.add_get("/api/breakers", breakers)
    app.router.add_get("/api/limits", limits)
    app.router.add_get("/metrics", metrics_handler)
    return app


def run_dashboard(settings: Settings, *, port: int | None = None) -> None:
    """Serve until SIGINT/SIGTERM, on ``metrics_host`` (loopback unless configured)."""
    chosen = settings.dashboard_port if port is None else port
    host = settings.observability.metrics_host
    print(
        f"dashboard: http://{host}:{chosen}/  (topic prefix {settings.topic_prefix!r})",
        flush=True,
    )
    # No access log: the page polls every 2 s; decisions are logged on their own.
    web.run_app(create_app(settings), host=host, port=chosen, print=None, access_log=None)
