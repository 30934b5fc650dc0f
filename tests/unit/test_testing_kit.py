"""The catalog authors' kit: offline dry-runs, `ratifier check-call`, `ratifier catalog
import` (OpenAI, Anthropic and MCP tool JSON → argument models)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from commands.catalog import Catalog, Resource
from commands.cedar_schema import generate_schema
from commands.policy import DEFAULT_POLICY_DIR
from ratifier.cli import main
from ratifier.testing import Kit
from ratifier.testing.scaffold import scaffold_catalog
from schemas.envelopes import Actor
from tests.unit.conftest import PAYMENT_ATTRS

PAYMENTS = {
    ("tenant-a", "pay_A1001"): Resource(
        kind="payment", id="pay_A1001", tenant="tenant-a", attributes=PAYMENT_ATTRS
    )
}


def payment_fixture(actor: Actor, args: Any) -> Resource | None:
    return PAYMENTS.get((actor.tenant, args.payment_id))


@pytest.fixture(scope="module")
def kit() -> Kit:
    return Kit.load(
        "commands.reference:catalog",
        DEFAULT_POLICY_DIR,
        loaders={"get_payment": payment_fixture, "propose_refund": payment_fixture},
    )


def test_a_permitted_read_runs_automatically(kit: Kit) -> None:
    run = kit.call("get_payment", {"payment_id": "pay_A1001"}, roles=["support"])
    assert run.status == "auto"
    assert run.policies == ("read-own-tenant",)
    assert run.outcome is None


def test_a_refund_goes_to_approval_and_over_the_amount_is_refused(kit: Kit) -> None:
    args = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "late"}
    assert kit.call("propose_refund", args, roles=["refund"]).status == "awaiting_approval"
    over = kit.call("propose_refund", {**args, "amount_minor": 5000}, roles=["refund"])
    assert (over.status, over.code, over.reason) == ("denied", "policy_denied", "no_permit")


def test_foreign_and_missing_resources_give_identical_outcomes(kit: Kit) -> None:
    foreign = kit.call("get_payment", {"payment_id": "pay_A1001"}, tenant="tenant-b")
    missing = kit.call("get_payment", {"payment_id": "pay_Nope"}, tenant="tenant-a")
    assert foreign.status == missing.status == "denied"
    assert foreign.error == missing.error
    assert foreign.model_text == missing.model_text
    assert "tenant-a" not in foreign.model_text


def test_an_evaluation_error_is_explained(kit: Kit) -> None:
    odd = Resource(
        kind="payment",
        id="pay_A1001",
        tenant="tenant-a",
        attributes={**PAYMENT_ATTRS, "risk": 0.5},
    )
    run = kit.call("get_payment", {"payment_id": "pay_A1001"}, resource=odd)
    assert run.reason is not None
    assert run.reason.value == "evaluation_error"
    assert "read-own-tenant" in run.policies
    assert "is a float" in run.explain()
    assert "is a float" not in run.model_text


def test_check_call_prints_the_decision_and_its_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = tmp_path / "call.json"
    call.write_text(
        json.dumps(
            {
                "tool": "delete_payment_method",
                "arguments": {"payment_method_id": "pm_A1"},
                "actor": {"tenant": "tenant-a", "sub": "agent-7", "roles": ["admin"]},
                "resource": {
                    "kind": "payment_method",
                    "id": "pm_A1",
                    "attributes": {"brand": "visa", "last4": "4242"},
                },
            }
        )
    )
    assert main(["check-call", str(call)]) == 1
    out = capsys.readouterr().out
    assert "denied" in out
    assert "reason: forbid" in out
    assert "policies: destructive-denied" in out
    assert "Destructive actions are not allowed." in out
    missing = tmp_path / "missing.json"
    missing.write_text(
        json.dumps(
            {
                "format": "openai",
                "call": {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_payment", "arguments": '{"payment_id":"pay_X"}'},
                },
                "actor": {"tenant": "tenant-a", "sub": "agent-7"},
                "resource": None,
            }
        )
    )
    assert main(["check-call", str(missing)]) == 1
    assert "code: not_found" in capsys.readouterr().out


PARAMETERS = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^o_[0-9]+$", "maxLength": 20},
        "reason": {"type": "string", "enum": ["mistake", "late"]},
        "lines": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 9},
                    "qty": {"type": "integer"},
                },
                "required": ["sku", "qty"],
            },
        },
        "note": {"type": ["string", "null"], "maxLength": 50},
    },
    "required": ["order_id", "reason", "lines"],
}
FORMS = {
    "openai": [
        {
            "type": "function",
            "function": {
                "name": "cancel_order",
                "description": "Cancel.",
                "parameters": PARAMETERS,
            },
        }
    ],
    "anthropic": [{"name": "cancel_order", "description": "Cancel.", "input_schema": PARAMETERS}],
    "mcp": {
        "tools": [{"name": "cancel_order", "description": "Cancel.", "inputSchema": PARAMETERS}]
    },
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_catalog_import_scaffolds_strict_argument_models(tmp_path: Path, form: str) -> None:
    source_file = tmp_path / "tools.json"
    source_file.write_text(json.dumps(FORMS[form]))
    source = scaffold_catalog(source_file)
    module = types.ModuleType(f"scaffold_{form}")
    sys.modules[module.__name__] = module  # pydantic resolves annotations through it
    try:
        exec(compile(source, "scaffold.py", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    catalog = module.catalog
    assert isinstance(catalog, Catalog)
    tool = catalog.get("cancel_order")
    assert tool is not None
    ok = {"order_id": "o_1", "reason": "late", "lines": [{"sku": "A", "qty": 1}]}
    assert tool.arguments.model_validate(ok).order_id == "o_1"  # type: ignore[attr-defined]
    for bad in ({**ok, "reason": "other"}, {**ok, "order_id": "x"}, {**ok, "extra": 1}):
        with pytest.raises(ValueError, match="validation error"):
            tool.arguments.model_validate(bad)
    assert generate_schema(catalog).problems == ()


def test_catalog_import_writes_a_file(tmp_path: Path) -> None:
    source_file = tmp_path / "tools.json"
    source_file.write_text(json.dumps(FORMS["anthropic"]))
    target = tmp_path / "catalog.py"
    assert (
        main(["catalog", "import", "--anthropic", str(source_file), "--output", str(target)]) == 0
    )
    assert "class CancelOrderArguments(ToolArguments):" in target.read_text()
