"""Real answers of the dashboard and of the approval API (on real PostgreSQL, Kafka and Redis)
match the OpenAPI documents (`schemas/json/openapi-*.json`, `ratifier/openapi.py`): each
status is one the document lists for that operation, and each JSON body validates against
the schema the document gives it (OpenAPI 3.1's dialect)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from openapi_schema_validator import OAS31Validator

from approvals.inbox import ApprovalInbox
from commands.limits import CallScope, buckets_of
from commands.policy import PolicySet
from config.settings import Settings
from dashboard.server import create_app
from feeds.policies import policy_record, publish_policies
from ratifier import openapi
from ratifier.contract_export import DEFAULT_DIR
from ratifier.topics import delete_topics, ensure_topics
from runtime.breakers import FleetBreakers
from runtime.clients import redis_client
from schemas.envelopes import ApprovalRequest, Effect
from schemas.names import Topic
from streams.limiter import Ask, FleetLimiter
from tests.integration.test_breakers import LIMITS as BREAKER_LIMITS
from tests.integration.test_dashboard_api import answers, world  # noqa: F401 - fixtures
from tests.integration.test_limits_api import LIMITS
from tests.services import bearer, publish

pytestmark = pytest.mark.integration

# The committed documents, as clients read them (tests/unit/test_openapi.py: they are fresh).
DASHBOARD = json.loads((DEFAULT_DIR / openapi.DASHBOARD_FILE).read_text(encoding="utf-8"))
APPROVALS = json.loads((DEFAULT_DIR / openapi.APPROVALS_FILE).read_text(encoding="utf-8"))


async def documented(
    document: dict[str, Any], method: str, path: str, response: ClientResponse
) -> Any:
    """The JSON body of ``response``, after checking that the document lists its status for
    ``method path`` and that the body is what the document says."""
    operation = document["paths"][path][method.lower()]
    assert str(response.status) in operation["responses"], (method, path, response.status)
    body = await response.json()
    schema = openapi.answer_schema(document, method, path, response.status)
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in OAS31Validator(schema).iter_errors(body)
    ]
    assert errors == [], (method, path, response.status, body)
    return body


@pytest.fixture
async def fresh(settings: Settings) -> AsyncIterator[Settings]:
    """A deployment of its own (its policy set, its limits), topics deleted after."""
    own = settings.model_copy(update={"topic_prefix": f"q{uuid.uuid4().hex[:10]}."})
    await ensure_topics(own)
    yield own
    await delete_topics(own)


async def test_dashboard_answers_match_the_document(
    dashboard: Any,
    world: Any,  # noqa: F811 - the fixture
    own_settings: Settings,
) -> None:
    ta = world["ta"]
    approver = bearer(own_settings, ta, ("approver",), sub="boss")
    support = bearer(own_settings, ta, ("support",))

    async def get(path: str, shown: str | None = None, **kwargs: Any) -> Any:
        return await documented(
            DASHBOARD, "GET", shown or path, await dashboard.get(path, **kwargs)
        )

    await get("/healthz")
    await get("/readyz")
    overview = await get("/api/overview", params={"window": "900"})
    assert overview["kpis"]["pending_approvals"] == 1 and overview["latency"]
    feed = await get("/api/feed")
    assert {i["kind"] for i in feed["items"]} == {"outcome", "decision"}
    operations = await get("/api/operations", params={"tenant": ta})
    assert len(operations["items"]) == 2 and operations["items"][0]["history"]
    assert (await get("/api/session", headers=approver))["tenant"] == ta
    inbox = await get("/api/approvals", headers=approver)
    assert [p["call_id"] for p in inbox["pending"]] == [world["ids"]["pend"]]
    await get("/api/breakers")
    await get("/api/freezes", headers=support)
    await get("/api/budgets", headers=support)
    # Errors: the error body, with a status the operation lists.
    assert (await get("/api/approvals"))["error"]["code"] == "unauthenticated"
    assert (await get("/api/approvals", headers=support))["error"]["code"] == "policy_denied"
    assert (await get("/api/overview", params={"status": "x"}))["error"]["code"] == (
        "invalid_arguments"
    )
    for path in ("/api/freezes", "/api/budgets", "/api/limits", "/api/session"):
        assert (await get(path))["error"]["code"] == "unauthenticated", path
    verdict_path = "/api/approvals/{call_id}/decisions/{decision_id}"
    unknown = await get(
        f"/api/approvals/{world['ids']['pend']}/decisions/d-{uuid.uuid4().hex[:8]}",
        verdict_path,
        headers=approver,
    )
    assert unknown["status"] == "published"
    assert (await get("/api/approvals/x/decisions/y%20z", verdict_path, headers=approver))["error"][
        "code"
    ] == "not_found"

    decision_path = "/api/approvals/{call_id}/decision"

    async def decide(call_id: str, body: Any) -> Any:
        response = await dashboard.post(
            f"/api/approvals/{call_id}/decision", json=body, headers=approver
        )
        return response.status, await documented(DASHBOARD, "POST", decision_path, response)

    assert (await decide(world["ids"]["old"], {"decision": "approve"}))[0] == 410
    assert (await decide(world["ids"]["done"], {"decision": "approve"}))[0] == 404
    assert (await decide(world["ids"]["pend"], {"decision": "maybe"}))[0] == 400
    status, body = await decide(world["ids"]["pend"], {"decision": "reject", "reason": "no"})
    assert status == 202 and body["follow"].endswith(body["decision_id"])

    # The kill switch: refused, published, listed, lifted.
    operator = bearer(own_settings, ta, ("operator",))
    freeze = {"scope": f"writes:{ta}", "frozen": True, "reason": "openapi"}

    async def throw(body: Any, headers: dict[str, str]) -> Any:
        response = await dashboard.post("/api/freezes", json=body, headers=headers)
        return response.status, await documented(DASHBOARD, "POST", "/api/freezes", response)

    assert (await throw(freeze, {}))[0] == 401
    assert (await throw(freeze, support))[0] == 403
    assert (await throw({**freeze, "scope": "everything"}, operator))[0] == 400
    status, thrown = await throw(freeze, operator)
    assert status == 202 and thrown["freeze"]["by_tenant"] == ta
    listed = await get("/api/freezes", headers=support)
    assert [f["scope"] for f in listed["freezes"]] == [f"writes:{ta}"]
    assert (await throw({**freeze, "frozen": False}, operator))[0] == 202


async def test_budgets_limits_and_breakers_with_data_match_the_document(
    fresh: Settings, tmp_path: Any
) -> None:
    from commands.budgets import load_budget_file, window_of
    from tests.unit.test_budget_context import budgeted_directory
    from tests.unit.test_budgets import REFUNDS_DAILY

    name = f"refunds-{uuid.uuid4().hex[:10]}"  # the test database outlives sessions
    directory = budgeted_directory(
        tmp_path, "", budgets=REFUNDS_DAILY.replace("refunds-daily", name)
    )
    (directory / "budgets.cedar").unlink()
    (budget,) = load_budget_file(directory)
    settings = fresh.model_copy(
        update={"policies": fresh.policies.model_copy(update={"directory": str(directory)})}
    )
    tenant = f"ta-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    with psycopg.connect(settings.storage.database_url, autocommit=True) as conn:
        for state, amount in (("consumed", 30_000), ("reserved", 700)):
            conn.execute(
                "INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, "
                "amount, state, reserved_at) VALUES (%s, %s, %s, 'agent=bot-1', %s, %s, %s, %s)",
                (tenant, name, uuid.uuid4().hex, window_of(budget, now).key, amount, state, now),
            )
    # Limits in force (published with the local folder's budgets) and a live bucket.
    local = PolicySet.from_directory(directory)
    limited = PolicySet.from_sources(local.text, local.schema, budgets=local.budgets, limits=LIMITS)
    await publish_policies(settings, policy_record(settings, limited))
    redis = redis_client(settings)
    try:
        limiter = FleetLimiter(redis, settings.admission, prefix=settings.topic_prefix)
        call = CallScope(
            call_id=f"c-{uuid.uuid4().hex}",
            tenant=tenant,
            agent="a",
            tool="get_payment",
            effect=Effect.READ,
        )
        assert (await limiter.admit([Ask(call=call, buckets=buckets_of(LIMITS, call))]))[0].admitted
        breakers = FleetBreakers(
            redis, prefix=settings.topic_prefix, defaults=BREAKER_LIMITS, by="test"
        )
        for _ in range(4):
            await breakers.record(await breakers.admit("payments:write"), ok=False, seconds=0.01)
    finally:
        await redis.aclose()
    headers = bearer(settings, tenant, ("support",))
    async with TestClient(TestServer(create_app(settings))) as dashboard:

        async def get(path: str) -> Any:
            return await documented(
                DASHBOARD, "GET", path, await dashboard.get(path, headers=headers)
            )

        budgets = await get("/api/budgets")
        (shown,) = [b for b in budgets["budgets"] if b["name"] == name]
        assert shown["scopes"][0]["used"] == 30_700
        limits = await get("/api/limits")
        assert limits["limits"] and limits["usage"]
        breakers_shown = await get("/api/breakers")
        assert [b["state"] for b in breakers_shown["breakers"]] == ["open"]


@pytest.fixture
async def approval_request(own_settings: Settings) -> ApprovalRequest:
    """A pending request on the module's deployment's `approvals.requested`."""
    tenant = f"tq-{uuid.uuid4().hex[:8]}"
    request = ApprovalRequest(
        call_id=f"call-{uuid.uuid4().hex[:12]}",
        operation_id=f"{tenant}:op-1",
        tenant=tenant,
        tool="propose_refund",
        arguments={"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late"},
        preview=("propose_refund requested by agent-1", "amount_minor: 10"),
        fingerprint="b" * 64,
        effect=Effect.EXTERNAL_WRITE,
        policy_version="p1",
        requested_by="agent-1",
        expires_at=datetime.now(UTC) + timedelta(minutes=10),
        subject="cust-1",
    )
    await publish(
        own_settings, [(request.call_id, request.to_bytes())], topic=Topic.APPROVALS_REQUESTED
    )
    return request


async def test_approval_api_answers_match_the_document(
    own_settings: Settings, approval_request: ApprovalRequest
) -> None:
    request = approval_request
    tenant, call_id = request.tenant, request.call_id
    boss = bearer(own_settings, tenant, ("approver",), sub="boss")
    customer = bearer(own_settings, tenant, (), sub="cust-1")
    app = openapi.approvals_app(own_settings)
    inbox = next(
        cell.cell_contents
        for route in app.router.routes()
        for cell in (getattr(route.handler, "__closure__", None) or ())
        if isinstance(cell.cell_contents, ApprovalInbox)
    )
    try:
        async with TestClient(TestServer(app)) as client:

            async def call(method: str, path: str, shown: str, **kwargs: Any) -> Any:
                response = await client.request(method, path, **kwargs)
                return response.status, await documented(APPROVALS, method, shown, response)

            assert (await call("GET", "/healthz", "/healthz"))[0] == 200
            assert (await call("GET", "/readyz", "/readyz"))[0] == 503  # not started
            status, listed = await call("GET", "/approvals", "/approvals", headers=boss)
            assert status == 200 and [p["call_id"] for p in listed["pending"]] == [call_id]
            assert (await call("GET", "/approvals", "/approvals"))[0] == 401
            clerk = bearer(own_settings, tenant, ("support",))
            assert (await call("GET", "/approvals", "/approvals", headers=clerk))[0] == 403
            one = "/approvals/{call_id}"
            assert (await call("GET", f"/approvals/{call_id}", one, headers=boss))[0] == 200
            assert (await call("GET", "/approvals/nope", one, headers=boss))[0] == 404
            confirmation = "/confirmations/{call_id}"
            shown = await call("GET", f"/confirmations/{call_id}", confirmation, headers=customer)
            assert shown[0] == 200 and shown[1]["subject"] == "cust-1"
            assert (await call("GET", f"/confirmations/{call_id}", confirmation, headers=boss))[
                0
            ] == 404
            decision = "/approvals/{call_id}/decision"
            path = f"/approvals/{call_id}/decision"
            assert (await call("POST", path, decision, json={"decision": "x"}, headers=boss))[
                0
            ] == 400
            with_arguments = {"decision": "approve", "arguments": {"amount_minor": 1}}
            status, refused = await call("POST", path, decision, json=with_arguments, headers=boss)
            assert (status, refused["error"]["refusal"]) == (400, "arguments_without_edit")
            requester = bearer(own_settings, tenant, ("approver",), sub="agent-1")
            status, refused = await call(
                "POST", path, decision, json={"decision": "approve"}, headers=requester
            )
            assert (status, refused["error"]["refusal"]) == (403, "self_approval")
            status, published = await call(
                "POST", path, decision, json={"decision": "approve"}, headers=boss
            )
            assert status == 202, published
            verdict = "/approvals/{call_id}/decisions/{decision_id}"
            status, answer = await call("GET", published["follow"], verdict, headers=boss)
            assert (status, answer["status"]) == (200, "published")
            confirm = "/confirmations/{call_id}"
            status, _ = await call(
                "POST",
                f"/confirmations/{call_id}",
                confirm,
                json={"decision": "edit"},
                headers=customer,
            )
            assert status == 400
            status, confirmed = await call(
                "POST",
                f"/confirmations/{call_id}",
                confirm,
                json={"decision": "approve"},
                headers=customer,
            )
            assert (status, confirmed["call_id"]) == (202, call_id)
            metrics = await client.get("/metrics")
            assert metrics.status == 200
    finally:
        await inbox.close()
