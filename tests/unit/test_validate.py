from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from commands.catalog import Catalog
from commands.validate import Limits, Rejection, Validated, validate
from schemas.envelopes import CallFormat, ProposedCall
from schemas.errors import ErrorCode

REFUND = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "double charge"}


def call(tool: str | None = "propose_refund", arguments: Any = None, **kw: Any) -> ProposedCall:
    return ProposedCall(
        call_id="c-1",
        tool=tool,
        arguments=REFUND if arguments is None else arguments,
        context="tok",
        proposed_at=datetime.now(UTC),
        **kw,
    )


def problems(result: Validated | Rejection) -> list[tuple[str, str]]:
    assert isinstance(result, Rejection)
    assert result.code is ErrorCode.INVALID_ARGUMENTS
    return [(f.path, f.problem) for f in result.fields]


def test_correct_call_is_validated_and_normalized(catalog: Catalog, limits: Limits) -> None:
    result = validate(call(), catalog, limits)
    assert isinstance(result, Validated)
    assert result.normalized == REFUND
    assert result.tool.name == "propose_refund"


def test_unknown_tool_is_exact_match(catalog: Catalog, limits: Limits) -> None:
    for name in ("Propose_Refund", "propose_refund ", "propose-refund", "refund_everything"):
        result = validate(call(tool=name), catalog, limits)
        assert isinstance(result, Rejection)
        assert result.code is ErrorCode.UNKNOWN_TOOL


@pytest.mark.parametrize(
    ("change", "path", "problem"),
    [
        ({"amount_minor": "4900"}, "$.arguments.amount_minor", "must be an integer"),
        ({"amount_minor": 49.0}, "$.arguments.amount_minor", "must be an integer"),
        ({"amount_minor": True}, "$.arguments.amount_minor", "must be an integer"),
        ({"amount_minor": 0}, "$.arguments.amount_minor", "is too small"),
        ({"amount_minor": -5}, "$.arguments.amount_minor", "is too small"),
        ({"amount_minor": 2**63}, "$.arguments.amount_minor", "is too large"),
        ({"payment_id": "PAY-1"}, "$.arguments.payment_id", "does not match the required pattern"),
        ({"reason": "x" * 301}, "$.arguments.reason", "is too long"),
        ({"tenant_id": "tenant-b"}, "$.arguments.tenant_id", "unexpected field"),
        ({"is_admin": True}, "$.arguments.is_admin", "unexpected field"),
    ],
)
def test_argument_matrix(
    catalog: Catalog, limits: Limits, change: dict[str, Any], path: str, problem: str
) -> None:
    assert problems(validate(call(arguments={**REFUND, **change}), catalog, limits)) == [
        (path, problem)
    ]


def test_missing_field_and_one_entry_per_problem(catalog: Catalog, limits: Limits) -> None:
    found = problems(validate(call(arguments={"amount_minor": "1"}), catalog, limits))
    assert ("$.arguments.payment_id", "required field is missing") in found
    assert ("$.arguments.reason", "required field is missing") in found
    assert ("$.arguments.amount_minor", "must be an integer") in found
    assert len(found) == 3


def test_arguments_as_json_string(catalog: Catalog, limits: Limits) -> None:
    assert isinstance(
        validate(
            call(arguments='{"payment_id":"pay_A1","amount_minor":1,"reason":"r"}'), catalog, limits
        ),
        Validated,
    )
    assert problems(validate(call(arguments="{not json"), catalog, limits)) == [
        ("$.arguments", "is not valid JSON")
    ]
    assert problems(validate(call(arguments=[1, 2]), catalog, limits)) == [
        ("$.arguments", "must be a JSON object")
    ]


def test_depth_and_string_limits(catalog: Catalog) -> None:
    nested: Any = "x"
    for _ in range(20):
        nested = {"a": nested}
    assert problems(validate(call(arguments={**REFUND, "deep": nested}), catalog, Limits())) == [
        ("$.arguments", "nesting is too deep")
    ]
    tight = Limits(max_string_length=16)
    assert problems(validate(call(arguments={**REFUND, "reason": "y" * 17}), catalog, tight)) == [
        ("$.arguments", "contains a string that is too long")
    ]


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        (
            CallFormat.OPENAI,
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_payment", "arguments": '{"payment_id":"pay_A1001"}'},
            },
        ),
        (
            CallFormat.ANTHROPIC,
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_payment",
                "input": {"payment_id": "pay_A1001"},
            },
        ),
        (CallFormat.MCP, {"name": "get_payment", "arguments": {"payment_id": "pay_A1001"}}),
    ],
)
def test_provider_formats_normalize(
    catalog: Catalog, limits: Limits, fmt: CallFormat, body: dict[str, Any]
) -> None:
    proposed = ProposedCall(
        call_id="c-2", context="tok", proposed_at=datetime.now(UTC), format=fmt, call=body
    )
    result = validate(proposed, catalog, limits)
    assert isinstance(result, Validated)
    assert result.tool.name == "get_payment"
    assert result.normalized == {"payment_id": "pay_A1001"}


@pytest.mark.parametrize(
    ("fmt", "body", "code", "path"),
    [
        (CallFormat.OPENAI, {"id": "call_1", "type": "function"}, ErrorCode.UNKNOWN_TOOL, None),
        (
            CallFormat.OPENAI,
            {"function": {"name": "get_payment", "arguments": "{oops"}},
            ErrorCode.INVALID_ARGUMENTS,
            "$.call.function.arguments",
        ),
        (
            CallFormat.OPENAI,
            {"function": {"name": "get_payment", "arguments": '{"payment_id": 7}'}},
            ErrorCode.INVALID_ARGUMENTS,
            "$.call.function.arguments.payment_id",
        ),
        (
            CallFormat.ANTHROPIC,
            {"type": "tool_use", "name": "get_payment"},
            ErrorCode.INVALID_ARGUMENTS,
            "$.call.input",
        ),
        (
            CallFormat.ANTHROPIC,
            {"type": "tool_use", "name": "GET_PAYMENT", "input": {}},
            ErrorCode.UNKNOWN_TOOL,
            None,
        ),
        (
            CallFormat.MCP,
            {"name": "get_payment", "arguments": ["pay_A1001"]},
            ErrorCode.INVALID_ARGUMENTS,
            "$.call.arguments",
        ),
        (CallFormat.MCP, {"name": 42, "arguments": {}}, ErrorCode.UNKNOWN_TOOL, None),
    ],
)
def test_broken_provider_formats(
    catalog: Catalog,
    limits: Limits,
    fmt: CallFormat,
    body: dict[str, Any],
    code: ErrorCode,
    path: str | None,
) -> None:
    proposed = ProposedCall(
        call_id="c-3", context="tok", proposed_at=datetime.now(UTC), format=fmt, call=body
    )
    result = validate(proposed, catalog, limits)
    assert isinstance(result, Rejection)
    assert result.code is code
    if path is not None:
        assert [f.path for f in result.fields] == [path]
