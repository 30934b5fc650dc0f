"""The validator's test matrix, shared by the unit suite (pure function) and the e2e suite
(through Kafka): one envelope change, the expected error code and field path."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

REFUND = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "duplicate charge"}


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@dataclass(frozen=True)
class Case:
    id: str
    change: dict[str, Any] = field(default_factory=dict)
    code: str | None = None  # None: the call passes validation
    path: str | None = None


def refund(**change: Any) -> dict[str, Any]:
    return {"tool": "propose_refund", "arguments": {**REFUND, **change}}


def without(key: str) -> dict[str, Any]:
    return {"tool": "propose_refund", "arguments": {k: v for k, v in REFUND.items() if k != key}}


MATRIX: tuple[Case, ...] = (
    Case("correct", refund()),
    Case("missing-field", without("reason"), "invalid_arguments", "$.arguments.reason"),
    Case(
        "string-amount",
        refund(amount_minor="4900"),
        "invalid_arguments",
        "$.arguments.amount_minor",
    ),
    Case(
        "float-amount", refund(amount_minor=49.0), "invalid_arguments", "$.arguments.amount_minor"
    ),
    Case("bool-amount", refund(amount_minor=True), "invalid_arguments", "$.arguments.amount_minor"),
    Case(
        "extra-tenant_id",
        refund(tenant_id="tenant-b"),
        "invalid_arguments",
        "$.arguments.tenant_id",
    ),
    Case("extra-is_admin", refund(is_admin=True), "invalid_arguments", "$.arguments.is_admin"),
    Case(
        "bad-id-pattern",
        refund(payment_id="../pay_1"),
        "invalid_arguments",
        "$.arguments.payment_id",
    ),
    Case("zero-amount", refund(amount_minor=0), "invalid_arguments", "$.arguments.amount_minor"),
    Case(
        "negative-amount", refund(amount_minor=-1), "invalid_arguments", "$.arguments.amount_minor"
    ),
    Case(
        "amount-2pow63", refund(amount_minor=2**63), "invalid_arguments", "$.arguments.amount_minor"
    ),
    Case("long-reason", refund(reason="r" * 301), "invalid_arguments", "$.arguments.reason"),
    Case("arguments-json-string", {"tool": "propose_refund", "arguments": json.dumps(REFUND)}),
    Case(
        "arguments-invalid-json",
        {"tool": "propose_refund", "arguments": '{"payment_id":'},
        "invalid_arguments",
        "$.arguments",
    ),
    Case(
        "arguments-array",
        {"tool": "propose_refund", "arguments": [REFUND]},
        "invalid_arguments",
        "$.arguments",
    ),
    Case(
        "openai",
        {
            "format": "openai",
            "tool": None,
            "arguments": None,
            "call": {
                "id": "call_1",
                "type": "function",
                "function": {"name": "propose_refund", "arguments": json.dumps(REFUND)},
            },
        },
    ),
    Case(
        "openai-broken",
        {
            "format": "openai",
            "tool": None,
            "arguments": None,
            "call": {
                "id": "call_1",
                "type": "function",
                "function": {"name": "propose_refund", "arguments": "{broken"},
            },
        },
        "invalid_arguments",
        "$.call.function.arguments",
    ),
    Case(
        "anthropic",
        {
            "format": "anthropic",
            "tool": None,
            "arguments": None,
            "call": {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "propose_refund",
                "input": REFUND,
            },
        },
    ),
    Case(
        "anthropic-broken",
        {
            "format": "anthropic",
            "tool": None,
            "arguments": None,
            "call": {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "propose_refund",
                "input": "not an object",
            },
        },
        "invalid_arguments",
        "$.call.input",
    ),
    Case(
        "mcp",
        {
            "format": "mcp",
            "tool": None,
            "arguments": None,
            "call": {"name": "propose_refund", "arguments": REFUND},
        },
    ),
    Case(
        "mcp-broken",
        {
            "format": "mcp",
            "tool": None,
            "arguments": None,
            "call": {"name": "propose_refund", "arguments": {**REFUND, "amount_minor": "1"}},
        },
        "invalid_arguments",
        "$.call.arguments.amount_minor",
    ),
    Case("unknown-tool", {"tool": "refund_everything"}, "unknown_tool"),
    Case("oversize-record", refund(reason="r" * 70_000), "malformed"),
    Case("deep-nesting", refund(deep=_nested(40)), "invalid_arguments", "$.arguments"),
    Case("wrong-version", {"v": 2}, "malformed"),
)


def envelope(case: Case, *, call_id: str, context: str, proposed_at: str) -> bytes:
    body: dict[str, Any] = {
        "v": 1,
        "call_id": call_id,
        "tool": "get_payment",
        "arguments": {"payment_id": "pay_A1001"},
        "context": context,
        "proposed_at": proposed_at,
    }
    body.update(case.change)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()
