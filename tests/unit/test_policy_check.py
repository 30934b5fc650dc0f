"""The Cedar schema generated from the catalog, `ratifier policy check` (every problem with
file and line), `policy publish` refusing a failing set, the start-up fit check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from commands.catalog import Catalog, HandlerResult, ResourceFacts, Tool, ToolArguments
from commands.cedar_schema import generate_schema
from commands.policy import (
    DEFAULT_POLICY_DIR,
    PolicySet,
    catalog_mismatches,
    check_policy_directory,
    statements,
)
from commands.reference import catalog as reference
from ratifier.cli import main
from schemas.envelopes import Effect


def test_the_reference_schema_file_is_the_generated_one() -> None:
    generated = generate_schema(reference)
    assert generated.problems == ()
    on_disk = (DEFAULT_POLICY_DIR / "schema.cedarschema.json").read_text(encoding="utf-8")
    assert on_disk == generated.text(), "regenerate: ratifier policy schema > ..."


def test_the_generated_schema_validates_the_reference_policies() -> None:
    assert check_policy_directory(DEFAULT_POLICY_DIR, reference) == []
    text = (DEFAULT_POLICY_DIR / "default.cedar").read_text(encoding="utf-8")
    PolicySet.from_sources(text, generate_schema(reference).text())


def test_type_mapping() -> None:
    from enum import StrEnum
    from typing import Literal

    from pydantic import BaseModel

    class Colour(StrEnum):
        RED = "red"

    class Line(BaseModel):
        sku: str
        quantity: int

    class Arguments(ToolArguments):
        name: str
        count: int
        flag: bool
        tags: list[str]
        lines: tuple[Line, ...]
        colour: Colour
        mode: Literal["a", "b"]
        note: str | None = None
        page: int = 1

    schema = generate_schema(Catalog([_tool("t", Arguments)]))
    assert schema.problems == ()
    attributes = schema.schema[""]["actions"]["t"]["appliesTo"]["context"]["attributes"]
    mapped = attributes["arguments"]["attributes"]
    assert mapped == {
        "name": {"type": "String"},
        "count": {"type": "Long"},
        "flag": {"type": "Boolean"},
        "tags": {"type": "Set", "element": {"type": "String"}},
        "lines": {
            "type": "Set",
            "element": {
                "type": "Record",
                "attributes": {"sku": {"type": "String"}, "quantity": {"type": "Long"}},
            },
        },
        "colour": {"type": "String"},
        "mode": {"type": "String"},
        "note": {"type": "String", "required": False},
        "page": {"type": "Long"},
    }


async def _handler(_ctx: Any) -> HandlerResult:
    return HandlerResult(result={})


async def _load(*_args: Any) -> None:
    return None


class OrderArguments(ToolArguments):
    order_id: str


class OrderFacts(ResourceFacts):
    kind = "order"
    status: str
    total_minor: int
    coupon: str | None = None


class FloatFacts(ResourceFacts):
    kind = "invoice"
    total: float


class UserFacts(ResourceFacts):
    kind = "user"
    name: str


def _tool(name: str, arguments: type[ToolArguments] = OrderArguments, facts: Any = None) -> Tool:
    return Tool(
        name=name,
        description=name,
        arguments=arguments,
        effect=Effect.READ,
        handler=_handler,
        load=_load if facts is not None else None,
        resource=facts,
    )


SHOP = Catalog([_tool("get_order", facts=OrderFacts)])


def _policy_dir(tmp_path: Path, catalog: Catalog, text: str) -> Path:
    (tmp_path / "shop.cedar").write_text(text, encoding="utf-8")
    (tmp_path / "schema.cedarschema.json").write_text(
        generate_schema(catalog).text(), encoding="utf-8"
    )
    return tmp_path


GOOD = """// The shop's policies.
@id("order-read")
permit (principal, action == Action::"get_order", resource)
when { resource.tenant == principal.tenant };
"""


def test_a_good_set_passes(tmp_path: Path) -> None:
    assert check_policy_directory(_policy_dir(tmp_path, SHOP, GOOD), SHOP) == []


def test_an_undeclared_attribute_is_reported_with_file_and_line(tmp_path: Path) -> None:
    broken = (
        GOOD
        + """
@id("big-orders")
forbid (principal, action, resource)
when { resource.amount > 100 };
"""
    )
    (problem,) = check_policy_directory(_policy_dir(tmp_path, SHOP, broken), SHOP)
    assert problem.file == str(tmp_path / "shop.cedar")
    # The typo's line, not the policy's first (its @id on line 6).
    assert problem.line == 8
    assert "attribute `amount` on entity type `Order` not found" in problem.message
    assert str(problem).startswith(f"{tmp_path / 'shop.cedar'}:8: ")


def test_a_maybe_missing_attribute_is_reported_with_file_and_line(tmp_path: Path) -> None:
    broken = (
        GOOD
        + """
@id("no-coupons")
forbid (principal, action, resource) when { resource.coupon == "FREE" };
"""
    )
    (problem,) = check_policy_directory(_policy_dir(tmp_path, SHOP, broken), SHOP)
    assert (problem.file, problem.line) == (str(tmp_path / "shop.cedar"), 7)
    assert "optional attribute `coupon`" in problem.message


def test_a_typo_deep_in_a_policy_is_reported_on_its_own_line(tmp_path: Path) -> None:
    """Syntax and schema errors inside a policy: at the typo's line, not the policy's first;
    a word in a comment or a string that reads like the typo does not mislead."""
    broken = (
        GOOD
        + """
@id("pending-only")
@message("Only pending orders; no amount talk")
forbid (principal, action == Action::"get_order", resource)
when {
  // the amount is checked below
  resource.status != "pending" &&
  resource.amount > 100
};

@id("syntax")
forbid (principal, action == Action::"get_order", resource)
when {
  resource.status == "x" &&
  resource.total_minor >> 100
};

@id("member")
forbid (principal, action == Action::"get_order", resource)
when {
  resource.status == "x" &&
  resourc.total_minor > 100
};
"""
    )
    problems = check_policy_directory(_policy_dir(tmp_path, SHOP, broken), SHOP)
    by_line = {p.line: p.message for p in problems}
    assert len(problems) == 3, problems
    assert "attribute `amount`" in by_line[12]
    assert "does not parse: unexpected token" in by_line[19]
    assert "does not parse: invalid member access" in by_line[26]


def test_a_float_attribute_is_reported_at_its_declaration(tmp_path: Path) -> None:
    catalog = Catalog(
        [_tool("get_order", facts=OrderFacts), _tool("get_invoice", facts=FloatFacts)]
    )
    problems = check_policy_directory(_policy_dir(tmp_path, catalog, GOOD), catalog)
    (problem,) = [p for p in problems if "float" in p.message]
    assert problem.file == __file__
    assert problem.line > 0
    assert "tool get_invoice: resource.total" in problem.message


def test_a_kind_named_user_is_reported_at_its_declaration(tmp_path: Path) -> None:
    catalog = Catalog([_tool("get_order", facts=OrderFacts), _tool("get_user", facts=UserFacts)])
    problems = check_policy_directory(_policy_dir(tmp_path, catalog, GOOD), catalog)
    (problem,) = [p for p in problems if "get_user" in p.message]
    assert problem.file == __file__
    assert "kind 'user' becomes the Cedar type User" in problem.message


def test_parse_errors_and_duplicate_ids_carry_their_line(tmp_path: Path) -> None:
    broken = (
        GOOD
        + """
// a comment; with a semicolon
@id("order-read")
permit (principal, action == Action::"get_order", resource) when { resource.status == "a;b" };

permit (principal, action, resource) when { resource.total_minor > 1.5 };
"""
    )
    problems = check_policy_directory(_policy_dir(tmp_path, SHOP, broken), SHOP)
    by_line = {p.line: p.message for p in problems}
    assert "also at" in by_line[7]
    assert "does not parse" in by_line[10]


def test_a_stale_schema_file_is_reported(tmp_path: Path) -> None:
    directory = _policy_dir(tmp_path, SHOP, GOOD)
    schema = json.loads((directory / "schema.cedarschema.json").read_text())
    del schema[""]["entityTypes"]["Order"]["shape"]["attributes"]["status"]
    (directory / "schema.cedarschema.json").write_text(json.dumps(schema))
    (problem,) = check_policy_directory(directory, SHOP)
    assert "differs from the schema generated from the catalog" in problem.message


def test_statements_keep_their_lines() -> None:
    found = statements('// x;\npermit (principal, action, resource);\n\n@id("a;")\nforbid (a);')
    assert [(s.line, s.text.split("\n")[0]) for s in found] == [
        (2, "permit (principal, action, resource);"),
        (4, '@id("a;")'),
    ]


def test_start_up_refuses_a_schema_missing_a_loader_attribute() -> None:
    schema = generate_schema(SHOP).schema
    del schema[""]["entityTypes"]["Order"]["shape"]["attributes"]["total_minor"]
    policies = PolicySet.from_sources(GOOD, json.dumps(schema))
    (problem,) = catalog_mismatches(policies, SHOP)
    assert "tool get_order" in problem
    assert "'total_minor'" in problem


def test_policy_check_and_publish_refuse_a_broken_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "policies"
    shutil.copytree(DEFAULT_POLICY_DIR, target)
    with (target / "default.cedar").open("a", encoding="utf-8") as f:
        f.write('\n@id("typo")\npermit (principal, action, resource)\n')
        f.write("when { resource.refundable > 0 };\n")
    assert main(["policy", "check", "--policies", str(target)]) == 1
    out = capsys.readouterr().out
    assert "default.cedar:" in out
    assert "attribute `refundable`" in out
    # Refused before anything is published (no broker is involved).
    assert main(["policy", "publish", "--policies", str(target)]) == 1
    assert "refused" in capsys.readouterr().err
    assert main(["policy", "check"]) == 0


def test_policy_schema_prints_the_generated_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == generate_schema(reference).schema
