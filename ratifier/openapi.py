"""The OpenAPI 3.1 documents of ratifier's two HTTP servers, generated from the code (`make
schemas` writes ``schemas/json/openapi-approvals.json`` and ``openapi-dashboard.json``):

- **approvals**: the HTTP server of `ratifier stages` (runtime/shell.py): the approver and
  confirmation API (`approvals.http.approval_routes`), `/healthz`, `/readyz`, `/metrics`;
- **dashboard**: `ratifier dashboard` (`dashboard.server.create_app`).

Two documents, one per server: they listen on different ports and answer different paths
(`/approvals/...` beside `/api/approvals/...`), so a client generator gets each server's API
alone. Each route's method and path come from the aiohttp application the code builds (built
here without starting any I/O); a route without an entry in `APPROVALS` / `DASHBOARD` below,
or an entry without a route, fails the generation (and `make contract`, and the unit test).
Bodies are JSON Schema from the pydantic models of `approvals.api_models` and
`dashboard.api_models`, once each under ``components.schemas``; errors are
`approvals.refusals.error_json`'s ``{"error": {"code", "message", "refusal"?}}`` with the
status of `approvals.inbox.HTTP_STATUS`. Authenticated routes take a context token (JWT) as
``Authorization: Bearer``. aiohttp also answers HEAD on every GET route (no body); the
documents list GET only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from approvals.api_models import (
    Body,
    ConfirmationRequest,
    DecisionPublished,
    DecisionRequest,
    DecisionVerdictAnswer,
    ErrorAnswer,
    PendingAnswer,
)
from config.settings import Settings, Streams
from dashboard import api_models as dash
from dashboard import shaping
from schemas.envelopes import ApprovalRequest, Status
from schemas.errors import ErrorCode

OPENAPI_VERSION = "3.1.0"
# The HTTP APIs' own version (not the Kafka contract's): minor = additive changes.
HTTP_API_VERSION = "1.0.0"
BEARER = "bearerAuth"

APPROVALS_FILE = "openapi-approvals.json"
DASHBOARD_FILE = "openapi-dashboard.json"


class ServiceLiveness(Body):
    """`/healthz` of a service (`runtime.health.Health.liveness`): 200 alive, 503 wedged."""

    service: str
    alive: bool
    phase: Literal["starting", "running"]
    last_loop_s: float | None = Field(description="seconds since the service's loop turned")


class ServiceReadiness(Body):
    """`/readyz` of a service (`runtime.health.Health.readiness`): 200 ready, 503 not (yet),
    ``why`` says which condition failed."""

    service: str
    ready: bool
    why: str | None
    partitions: int
    lag: int | None
    max_lag: int
    last_poll_s: float | None


# The errors of the approver surfaces: status → (name, code, when).
ERRORS: dict[int, tuple[str, ErrorCode, str]] = {
    400: (
        "InvalidArguments",
        ErrorCode.INVALID_ARGUMENTS,
        "The body or a query parameter is not valid (refusal `arguments_without_edit`: "
        "arguments on an approve or a reject).",
    ),
    401: (
        "Unauthenticated",
        ErrorCode.UNAUTHENTICATED,
        "No bearer token, or it does not verify (signature, expiry, audience, issuer).",
    ),
    403: (
        "PolicyDenied",
        ErrorCode.POLICY_DENIED,
        "The token lacks the role or right (a refused decision names its `refusal`: "
        "`self_approval`, `approver_not_permitted`, `edit_without_arguments`, ...).",
    ),
    404: (
        "NotFound",
        ErrorCode.NOT_FOUND,
        "No such pending request (decided or ended meanwhile; another tenant's looks the same).",
    ),
    409: (
        "Conflict",
        ErrorCode.CONFLICT,
        "Four-eyes: this approver's approval already counts (refusal `same_approver`).",
    ),
    410: ("ApprovalExpired", ErrorCode.APPROVAL_EXPIRED, "The request expired."),
    503: (
        "Unavailable",
        ErrorCode.RETRYABLE_ERROR,
        "PostgreSQL, Redis or Kafka is not reachable; nothing was published. Retry.",
    ),
}


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A success answer: its status, body model (None: not JSON) and media type."""

    status: int = 200
    model: type[BaseModel] | None = None
    media: str = "application/json"
    description: str = "OK"


@dataclass(frozen=True, kw_only=True)
class Query:
    name: str
    description: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})


@dataclass(frozen=True, kw_only=True)
class Operation:
    """What the document says of one route (method, path)."""

    operation_id: str
    summary: str
    answers: tuple[Answer, ...]
    errors: tuple[int, ...] = ()
    request: type[BaseModel] | None = None
    bearer: bool = False
    query: tuple[Query, ...] = ()
    tags: tuple[str, ...] = ()


def _json(model: type[BaseModel], status: int = 200, description: str = "OK") -> tuple[Answer]:
    return (Answer(status=status, model=model, description=description),)


_FILTERS = (
    Query(
        name="window",
        description="the time window in seconds (default 3600)",
        schema={"type": "integer", "enum": sorted(shaping.WINDOWS)},
    ),
    Query(name="tenant", description="only this tenant"),
    Query(name="tool", description="only this tool"),
    Query(
        name="status",
        description="only outcomes of this status",
        schema={"type": "string", "enum": [s.value for s in Status]},
    ),
    Query(
        name="error_code",
        description="only outcomes with this error code",
        schema={"type": "string", "enum": [c.value for c in ErrorCode]},
    ),
)

_HEALTH = (
    Operation(
        operation_id="healthz",
        summary="Liveness: the process's loops turn",
        answers=(
            Answer(model=ServiceLiveness, description="alive"),
            Answer(status=503, model=ServiceLiveness, description="wedged: restart it"),
        ),
        tags=("health",),
    ),
    Operation(
        operation_id="readyz",
        summary="Readiness: started, connected, polling, partitions assigned, caught up",
        answers=(
            Answer(model=ServiceReadiness, description="ready"),
            Answer(status=503, model=ServiceReadiness, description="not ready (`why`)"),
        ),
        tags=("health",),
    ),
)
_METRICS = Operation(
    operation_id="metrics",
    summary="Prometheus metrics (text exposition format)",
    answers=(Answer(media="text/plain", description="the metrics"),),
    tags=("health",),
)

# The approval API of `ratifier stages` (approvals/http.py) and that server's health pages.
APPROVALS: dict[tuple[str, str], Operation] = {
    ("GET", "/healthz"): _HEALTH[0],
    ("GET", "/readyz"): _HEALTH[1],
    ("GET", "/metrics"): _METRICS,
    ("GET", "/approvals"): Operation(
        operation_id="listPending",
        summary="The approver tenant's pending requests",
        answers=_json(PendingAnswer),
        errors=(401, 403),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/approvals/{call_id}"): Operation(
        operation_id="getPending",
        summary="One pending request of the approver's tenant",
        answers=_json(ApprovalRequest),
        errors=(401, 403, 404),
        bearer=True,
        tags=("approvals",),
    ),
    ("POST", "/approvals/{call_id}/decision"): Operation(
        operation_id="decide",
        summary="Approve, reject or edit: checked with the join's rule, signed and published",
        request=DecisionRequest,
        answers=_json(DecisionPublished, 202, "published; follow the verdict at `follow`"),
        errors=(400, 401, 403, 404, 409, 503),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/approvals/{call_id}/decisions/{decision_id}"): Operation(
        operation_id="getVerdict",
        summary="What the approval-join made of one decision",
        answers=_json(DecisionVerdictAnswer),
        errors=(401, 403, 503),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/confirmations/{call_id}"): Operation(
        operation_id="getConfirmation",
        summary="The request, for the subject the call acts for only (others': 404)",
        answers=_json(ApprovalRequest),
        errors=(401, 404),
        bearer=True,
        tags=("confirmations",),
    ),
    ("POST", "/confirmations/{call_id}"): Operation(
        operation_id="confirm",
        summary="The end user confirms (or declines) a call that acts for them",
        request=ConfirmationRequest,
        answers=_json(DecisionPublished, 202, "published; follow the verdict at `follow`"),
        errors=(400, 401, 403, 404, 409, 503),
        bearer=True,
        tags=("confirmations",),
    ),
}

# `ratifier dashboard` (dashboard/server.py).
DASHBOARD: dict[tuple[str, str], Operation] = {
    ("GET", "/healthz"): Operation(
        operation_id="healthz",
        summary="Liveness: the server answers",
        answers=_json(dash.DashboardAlive),
        tags=("health",),
    ),
    ("GET", "/readyz"): Operation(
        operation_id="readyz",
        summary="Readiness: PostgreSQL answers",
        answers=(
            Answer(model=dash.DashboardReady, description="ready"),
            Answer(status=503, model=dash.DashboardReady, description="not ready (`why`)"),
        ),
        tags=("health",),
    ),
    ("GET", "/metrics"): _METRICS,
    ("GET", "/"): Operation(
        operation_id="page",
        summary="The dashboard's page",
        answers=(Answer(media="text/html", description="the page"),),
        tags=("page",),
    ),
    ("GET", "/static/{name}"): Operation(
        operation_id="staticFile",
        summary="The page's script and style sheet (`app.js`, `app.css`)",
        answers=(
            Answer(media="text/javascript", description="app.js"),
            Answer(media="text/css", description="app.css"),
            Answer(status=404, media="text/plain", description="no such file"),
        ),
        tags=("page",),
    ),
    ("GET", "/api/overview"): Operation(
        operation_id="overview",
        summary="Key figures, outcome series, counts, latency, filter choices",
        answers=_json(dash.Overview),
        errors=(400, 503),
        query=_FILTERS,
        tags=("observe",),
    ),
    ("GET", "/api/feed"): Operation(
        operation_id="feed",
        summary="The newest outcomes and approval decisions",
        answers=_json(dash.FeedAnswer),
        errors=(400, 503),
        query=_FILTERS,
        tags=("observe",),
    ),
    ("GET", "/api/operations"): Operation(
        operation_id="operations",
        summary="Unknown, escalated and recently reconciled operations with their history",
        answers=_json(dash.OperationsAnswer),
        errors=(400, 503),
        query=(_FILTERS[1],),
        tags=("observe",),
    ),
    ("GET", "/api/session"): Operation(
        operation_id="session",
        summary="Who the token names and what it may do (approve, freeze)",
        answers=_json(dash.Session),
        errors=(401,),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/api/approvals"): Operation(
        operation_id="listPending",
        summary="The approver tenant's pending requests, soonest to expire first",
        answers=_json(dash.InboxAnswer),
        errors=(401, 403, 503),
        bearer=True,
        tags=("approvals",),
    ),
    ("POST", "/api/approvals/{call_id}/decision"): Operation(
        operation_id="decide",
        summary="Approve, reject or edit: checked with the join's rule, signed and published",
        request=DecisionRequest,
        answers=_json(DecisionPublished, 202, "published; follow the verdict at `follow`"),
        errors=(400, 401, 403, 404, 409, 410, 503),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/api/approvals/{call_id}/decisions/{decision_id}"): Operation(
        operation_id="getVerdict",
        summary="What the approval-join made of one decision",
        answers=_json(DecisionVerdictAnswer),
        errors=(401, 403, 404, 503),
        bearer=True,
        tags=("approvals",),
    ),
    ("GET", "/api/freezes"): Operation(
        operation_id="listFreezes",
        summary="The frozen scopes of the token's tenant and the fleet-wide ones",
        answers=_json(dash.FreezesAnswer),
        errors=(401, 503),
        bearer=True,
        tags=("kill switch",),
    ),
    ("POST", "/api/freezes"): Operation(
        operation_id="throwSwitch",
        summary="Freeze or unfreeze a scope (operator rights by Cedar policy)",
        request=dash.FreezeRequest,
        answers=_json(dash.FreezeThrown, 202, "published and acknowledged by the broker"),
        errors=(400, 401, 403, 503),
        bearer=True,
        tags=("kill switch",),
    ),
    ("GET", "/api/budgets"): Operation(
        operation_id="budgets",
        summary="The budgets in force with the current window's usage of the token's tenant",
        answers=_json(dash.BudgetsAnswer),
        errors=(401, 503),
        bearer=True,
        tags=("budgets",),
    ),
    ("GET", "/api/breakers"): Operation(
        operation_id="breakers",
        summary="Every downstream's circuit breaker and its current window",
        answers=_json(dash.BreakersAnswer),
        errors=(503,),
        tags=("observe",),
    ),
    ("GET", "/api/limits"): Operation(
        operation_id="limits",
        summary="Admission limits in force for the token's tenant and its live buckets",
        answers=_json(dash.LimitsAnswer),
        errors=(401, 503),
        bearer=True,
        tags=("budgets",),
    ),
}


# -- the applications, as the code builds them -------------------------------------------------


def development_settings() -> Settings:
    """Settings to build the applications with (their routes do not depend on them); the
    built-in keys of development mode, so that no real key is needed to render the docs."""
    return Settings(development_mode=True)


def approvals_app(settings: Settings) -> web.Application:
    """The application `ratifier stages` serves (`runtime.shell.ServiceShell`: its health
    pages and routes, then `telemetry.metrics.serve_metrics` adds /metrics); nothing started."""
    from approvals.http import approval_routes  # noqa: PLC0415 - built only to be read
    from approvals.inbox import ApprovalInbox  # noqa: PLC0415
    from commands.catalog import load_catalog  # noqa: PLC0415
    from runtime.health import Health, add_health_routes  # noqa: PLC0415
    from runtime.identity import context_keys  # noqa: PLC0415
    from telemetry.metrics import metrics_handler  # noqa: PLC0415

    app = web.Application()
    add_health_routes(app, Health("stages"))
    mount = approval_routes(
        settings,
        inbox=ApprovalInbox(settings),
        keys=context_keys(settings),
        catalog=load_catalog(settings.catalog),
    )
    mount(app)
    app.router.add_get("/metrics", metrics_handler)
    return app


def dashboard_app(settings: Settings) -> web.Application:
    from dashboard.server import create_app  # noqa: PLC0415 - built only to be read

    return create_app(settings)


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route of ``app``; HEAD, which aiohttp adds to each GET, left
    out."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }


class UndocumentedRoute(Exception):
    """A route the application serves without an entry in the document's table (or the
    other way round)."""


# -- rendering ---------------------------------------------------------------------------------

_PATH_PARAMETER = re.compile(r"\{(\w+)\}")


def _schemas(table: Mapping[tuple[str, str], Operation]) -> tuple[dict[Any, Any], dict[str, Any]]:
    wanted: set[tuple[type[BaseModel], JsonSchemaMode]] = {(ErrorAnswer, "serialization")}
    for operation in table.values():
        if operation.request is not None:
            wanted.add((operation.request, "validation"))
        wanted |= {(a.model, "serialization") for a in operation.answers if a.model is not None}
    refs, top = models_json_schema(
        sorted(wanted, key=lambda pair: (pair[0].__name__, pair[1])),
        ref_template="#/components/schemas/{model}",
    )
    return dict(refs), dict(sorted(top.get("$defs", {}).items()))


def _operation(
    path: str, operation: Operation, refs: Mapping[Any, Any], used_errors: set[int]
) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAMETER.findall(path)
    ]
    parameters += [
        {"name": q.name, "in": "query", "required": False, "description": q.description}
        | {"schema": dict(q.schema)}
        for q in operation.query
    ]
    responses: dict[str, Any] = {}
    for answer in operation.answers:
        if answer.model is None:
            content = {answer.media: {"schema": {"type": "string"}}}
        else:
            content = {answer.media: {"schema": refs[(answer.model, "serialization")]}}
        shown = responses.setdefault(str(answer.status), {"description": answer.description})
        if shown["description"] != answer.description:
            shown["description"] += f"; {answer.description}"
        shown.setdefault("content", {}).update(content)
    for status in operation.errors:
        used_errors.add(status)
        responses[str(status)] = {"$ref": f"#/components/responses/{ERRORS[status][0]}"}
    body: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "tags": list(operation.tags),
    }
    if parameters:
        body["parameters"] = parameters
    if operation.request is not None:
        body["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[(operation.request, "validation")]}},
        }
    body["responses"] = dict(sorted(responses.items()))
    body["security"] = [{BEARER: []}] if operation.bearer else []
    return body


def render_document(
    app: web.Application,
    table: Mapping[tuple[str, str], Operation],
    *,
    title: str,
    description: str,
    server: dict[str, Any],
) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s routes as ``table`` describes them."""
    served = routes_of(app)
    missing, extra = served - set(table), set(table) - served
    if missing or extra:
        raise UndocumentedRoute(
            f"{title}: served without documentation: {sorted(missing)}; "
            f"documented but not served: {sorted(extra)} (ratifier/openapi.py)"
        )
    refs, schemas = _schemas(table)
    used_errors: set[int] = set()
    paths: dict[str, dict[str, Any]] = {}
    for method, path in sorted(table):
        operation = _operation(path, table[(method, path)], refs, used_errors)
        paths.setdefault(path, {})[method.lower()] = operation
    error_ref = refs[(ErrorAnswer, "serialization")]
    responses = {
        ERRORS[status][0]: {
            "description": f"`{ERRORS[status][1].value}`: {ERRORS[status][2]}",
            "content": {"application/json": {"schema": error_ref}},
        }
        for status in sorted(used_errors)
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": HTTP_API_VERSION, "description": description},
        "servers": [server],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": {
                BEARER: {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": (
                        "a context token (`ratifier token`): signed, with the tenant, `sub` and "
                        "roles the route needs (`approver`, `operator` by Cedar policy)"
                    ),
                }
            },
        },
    }


DOCUMENTS: dict[str, tuple[Callable[[Settings], web.Application], dict[tuple[str, str], Operation]]]
DOCUMENTS = {APPROVALS_FILE: (approvals_app, APPROVALS), DASHBOARD_FILE: (dashboard_app, DASHBOARD)}


def render(settings: Settings | None = None) -> dict[str, dict[str, Any]]:
    """File name → OpenAPI document, for both servers."""
    settings = settings or development_settings()
    port = Streams.model_fields["http_port"].default
    dashboard_port = Settings.model_fields["dashboard_port"].default
    approvals = render_document(
        approvals_app(settings),
        APPROVALS,
        title="ratifier approval API",
        description=(
            "The approver and end-user confirmation API of `ratifier stages` (approvals/http.py) "
            "and that server's health pages. A decision is checked with the approval-join's "
            "rule, then published as a statement signed with the approval service's key; the "
            "bearer token never leaves the request. docs/approvals.md, docs/agents.md."
        ),
        server={
            "url": "http://127.0.0.1:{port}",
            "description": "`ratifier stages` (RATIFIER_STREAMS__HTTP_PORT)",
            "variables": {"port": {"default": str(port)}},
        },
    )
    dashboard = render_document(
        dashboard_app(settings),
        DASHBOARD,
        title="ratifier dashboard API",
        description=(
            "The JSON API of `ratifier dashboard` (dashboard/server.py): read-only views of the "
            "pipeline, the approval inbox, the kill switch, budgets, breakers and limits. "
            "docs/dashboard.md."
        ),
        server={
            "url": "http://127.0.0.1:{port}",
            "description": "`ratifier dashboard` (RATIFIER_DASHBOARD_PORT)",
            "variables": {"port": {"default": str(dashboard_port)}},
        },
    )
    return {APPROVALS_FILE: approvals, DASHBOARD_FILE: dashboard}


def answer_schema(
    document: Mapping[str, Any], method: str, path: str, status: int
) -> dict[str, Any]:
    """The JSON Schema (2020-12, self-contained: the document's components beside a ``$ref``)
    of the JSON body ``document`` says ``method path`` answers with ``status``: to check a
    real answer against the document."""
    response = document["paths"][path][method.lower()]["responses"][str(status)]
    if "$ref" in response:
        response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = response["content"]["application/json"]["schema"]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "components": document["components"],
    }
