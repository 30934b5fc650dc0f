"""The OpenAPI 3.1 documents of the approval API and the dashboard (`ratifier/openapi.py`):
valid by the standard validator, generated from the routes the code registers (a route
without documentation fails), every documented body's schema referenced, and the answers
the code builds without I/O (errors, verdicts, freezes, budgets, feed lines) match them."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.validation.exceptions import (
    OpenAPIValidationError,
    UnresolvableParameterError,
)
from referencing.exceptions import Unresolvable

from approvals.api_models import ErrorAnswer
from approvals.inbox import HTTP_STATUS
from approvals.refusals import error_json, refusal_error
from approvals.signing import DecisionRefusal
from approvals.verdicts import verdict_from
from commands.budgets import Budget
from dashboard import shaping
from dashboard.api_models import Freeze
from ratifier import openapi
from ratifier.contract_export import DEFAULT_DIR
from schemas.envelopes import FreezeRecord
from schemas.errors import (
    InvalidArguments,
    PolicyDenied,
    ResourceNotFound,
    StorageUnavailable,
    Unauthenticated,
)


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    return openapi.render()


@pytest.fixture(scope="module")
def apps() -> dict[str, web.Application]:
    settings = openapi.development_settings()
    return {name: build(settings) for name, (build, _) in openapi.DOCUMENTS.items()}


def test_both_documents_are_valid_openapi_3_1(documents: dict[str, dict[str, Any]]) -> None:
    assert set(documents) == {"openapi-approvals.json", "openapi-dashboard.json"}
    for name, document in documents.items():
        assert document["openapi"] == "3.1.0"
        validate(document, cls=OpenAPIV31SpecValidator)
        # The committed file is this document (`make schemas`; `make contract` validates it).
        on_disk = json.loads((DEFAULT_DIR / name).read_text(encoding="utf-8"))
        assert on_disk == document, f"{name} is stale: run `make schemas`"


def test_the_validator_refuses_a_broken_document(documents: dict[str, dict[str, Any]]) -> None:
    undeclared = copy.deepcopy(documents["openapi-dashboard.json"])
    del undeclared["paths"]["/api/approvals/{call_id}/decision"]["post"]["parameters"]
    with pytest.raises(UnresolvableParameterError):
        validate(undeclared, cls=OpenAPIV31SpecValidator)
    dangling = copy.deepcopy(documents["openapi-dashboard.json"])
    del dangling["components"]["schemas"]["Freeze"]
    with pytest.raises(Unresolvable):
        validate(dangling, cls=OpenAPIV31SpecValidator)
    wrong_type = copy.deepcopy(documents["openapi-approvals.json"])
    wrong_type["components"]["securitySchemes"]["bearerAuth"]["type"] = "token"
    with pytest.raises(OpenAPIValidationError):
        validate(wrong_type, cls=OpenAPIV31SpecValidator)


def test_every_route_served_is_documented_and_every_documented_route_served(
    documents: dict[str, dict[str, Any]], apps: dict[str, web.Application]
) -> None:
    for name, (_, table) in openapi.DOCUMENTS.items():
        served = openapi.routes_of(apps[name])
        documented = {
            (method.upper(), path)
            for path, item in documents[name]["paths"].items()
            for method in item
        }
        assert served == documented == set(table), name
    # The routes the issue names are there, with the status codes their handlers answer.
    paths = documents["openapi-dashboard.json"]["paths"]
    assert set(paths["/api/freezes"]["get"]["responses"]) == {"200", "401", "503"}
    assert set(paths["/api/freezes"]["post"]["responses"]) == {"202", "400", "401", "403", "503"}
    assert set(paths["/api/budgets"]["get"]["responses"]) == {"200", "401", "503"}


def test_a_route_without_documentation_fails_the_generation(
    apps: dict[str, web.Application],
) -> None:
    async def extra(_request: web.Request) -> web.Response:
        return web.Response()

    settings = openapi.development_settings()
    app = openapi.dashboard_app(settings)
    app.router.add_get("/api/undocumented", extra)
    with pytest.raises(openapi.UndocumentedRoute, match="/api/undocumented"):
        openapi.render_document(
            app, openapi.DASHBOARD, title="t", description="d", server={"url": "/"}
        )
    # And an entry whose route is gone.
    fewer = {k: v for k, v in openapi.DASHBOARD.items() if k != ("GET", "/api/budgets")}
    with pytest.raises(openapi.UndocumentedRoute, match="/api/budgets"):
        openapi.render_document(
            apps["openapi-dashboard.json"], fewer, title="t", description="d", server={"url": "/"}
        )


def test_every_documented_model_is_referenced_and_every_reference_resolves(
    documents: dict[str, dict[str, Any]],
) -> None:
    for name, (_, table) in openapi.DOCUMENTS.items():
        document = documents[name]
        text = json.dumps(document["paths"]) + json.dumps(document["components"]["responses"])
        for (method, path), operation in table.items():
            item = document["paths"][path][method.lower()]
            for answer in operation.answers:
                content = item["responses"][str(answer.status)]["content"][answer.media]
                if answer.model is not None:
                    ref = f"#/components/schemas/{answer.model.__name__}"
                    assert content["schema"] == {"$ref": ref}, (name, method, path)
            if operation.request is not None:
                body = item["requestBody"]["content"]["application/json"]["schema"]
                assert body == {"$ref": f"#/components/schemas/{operation.request.__name__}"}
            assert item["security"] == ([{"bearerAuth": []}] if operation.bearer else [])
            for status in operation.errors:
                assert item["responses"][str(status)]["$ref"].startswith("#/components/responses/")
        assert '"#/components/schemas/ErrorAnswer"' in text
        # No schema is left unreferenced: each is reachable from an operation.
        schemas = document["components"]["schemas"]
        reachable: set[str] = set()
        todo = set(re.findall(r'"#/components/schemas/([^"]+)"', text))
        while todo:
            found = todo.pop()
            reachable.add(found)
            inner = json.dumps(schemas[found])
            todo |= set(re.findall(r'"#/components/schemas/([^"]+)"', inner)) - reachable
        assert reachable == set(schemas), name


def test_the_documented_error_statuses_are_the_status_map() -> None:
    for status, (_, code, _) in openapi.ERRORS.items():
        assert HTTP_STATUS[code] == status


def _errors(document: dict[str, Any], method: str, path: str, status: int, body: Any) -> list[str]:
    """Where ``body`` differs from what ``document`` says ``method path`` answers with
    ``status`` (OpenAPI 3.1's schema dialect)."""
    validator = OAS31Validator(openapi.answer_schema(document, method, path, status))
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]


def _check(document: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    assert _errors(document, method, path, status, body) == []


def test_error_bodies_match_the_documented_error(documents: dict[str, dict[str, Any]]) -> None:
    document = documents["openapi-approvals.json"]
    errors: list[Any] = [
        Unauthenticated(),
        PolicyDenied("no"),
        ResourceNotFound(),
        InvalidArguments("x"),
        StorageUnavailable("down"),
    ]
    errors += [refusal_error(refusal) for refusal in DecisionRefusal]
    for exc in errors:
        body = error_json(exc)
        _check(document, "POST", "/approvals/{call_id}/decision", HTTP_STATUS[exc.code], body)
        ErrorAnswer.model_validate(body)
    assert _errors(document, "GET", "/approvals", 401, {"error": {"code": "unauthenticated"}})


def test_verdicts_match_the_documented_answer(documents: dict[str, dict[str, Any]]) -> None:
    rows = [
        {"kind": "approval_decision_refused", "detail": {"decision_id": "d1", "refusal": "x"}},
        {
            "kind": "approval_decision",
            "detail": {"decision_id": "d2", "approvals": 1, "required_approvals": 2},
        },
    ]
    for decision_id, outcome in (("d1", None), ("d2", None), ("d2", "succeeded"), ("d3", None)):
        body = verdict_from(rows, call_id="c", decision_id=decision_id, outcome=outcome).to_json()
        for name, path in (
            ("openapi-approvals.json", "/approvals/{call_id}/decisions/{decision_id}"),
            ("openapi-dashboard.json", "/api/approvals/{call_id}/decisions/{decision_id}"),
        ):
            _check(documents[name], "GET", path, 200, body)


def test_freezes_are_shown_as_their_controls_record(documents: dict[str, dict[str, Any]]) -> None:
    assert set(Freeze.model_fields) == set(FreezeRecord.model_fields) - {"v"}
    record = FreezeRecord(
        scope="writes:tenant-a",
        frozen=True,
        by="ops-1",
        by_tenant="tenant-a",
        reason="incident",
        at=datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
    )
    shown = Freeze.of(record).model_dump(mode="json")
    assert shown == record.model_dump(mode="json", exclude={"v"})
    document = documents["openapi-dashboard.json"]
    _check(document, "GET", "/api/freezes", 200, {"freezes": [shown]})
    _check(document, "POST", "/api/freezes", 202, {"published": True, "freeze": shown})
    # A field the record does not have.
    assert _errors(document, "GET", "/api/freezes", 200, {"freezes": [{**shown, "v": 1}]})


def test_the_budgets_panel_matches_the_documented_answer(
    documents: dict[str, dict[str, Any]],
) -> None:
    budget = Budget(
        name="refunds-daily",
        tools=("propose_refund",),
        per=("agent",),
        measure="sum:amount_minor",
        cap=50_000,
        window="day",
        time_zone="Europe/Berlin",
    )
    now = datetime.now(UTC)
    rows = [
        {
            "budget": "refunds-daily",
            "scope_key": "agent=bot-1",
            "consumed": 30_000,
            "reserved": 700,
            "oldest": now,
        }
    ]
    panel = shaping.budgets_panel([budget], rows, now=now)
    body = {"tenant": "tenant-a", "policy_version": "sha256:0", "budgets": panel}
    _check(documents["openapi-dashboard.json"], "GET", "/api/budgets", 200, body)


def test_feed_lines_match_the_documented_answer(documents: dict[str, dict[str, Any]]) -> None:
    now = datetime.now(UTC)
    base = {
        "kafka_partition": 0,
        "kafka_offset": 1,
        "record_at": now,
        "call_id": "c-1",
        "tenant": "tenant-a",
        "tool": "propose_refund",
        "status": None,
        "error_code": None,
    }
    decision = {
        **base,
        "stream": "approvals.decided",
        "record": {"decision": "approve", "decided_by": "boss", "reason": "ok"},
    }
    outcome = {
        **base,
        "stream": "outcomes",
        "status": "denied",
        "error_code": "policy_denied",
        "record": {"stage": "authorize", "error": {"code": "policy_denied", "message": "no"}},
    }
    items = [shaping.feed_item(decision), shaping.feed_item(outcome)]
    _check(documents["openapi-dashboard.json"], "GET", "/api/feed", 200, {"items": items})
