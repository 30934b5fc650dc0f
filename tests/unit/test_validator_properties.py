"""Property tests: whatever arrives on calls.proposed, the validator yields exactly one typed
result and never raises."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.reference import catalog
from commands.validate import Limits, Malformed, Rejection, Validated, parse_envelope, validate
from schemas.envelopes import DeadLetter, Outcome, ProposedCall, SourcePosition, ValidatedCall
from streams.validator import on_proposed
from tests.unit.conftest import NOW

LIMITS = Limits()
SOURCE = SourcePosition(topic="t", partition=0, offset=0)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)

tool_names = st.sampled_from([*catalog.names, "", "Get_Payment", "nope"]) | st.text(max_size=20)


def envelopes() -> st.SearchStrategy[dict[str, Any]]:
    native = st.fixed_dictionaries(
        {
            "v": st.just(1),
            "call_id": st.from_regex(r"[A-Za-z0-9._:-]{1,20}", fullmatch=True),
            "tool": tool_names,
            "arguments": json_values | st.text(max_size=40),
            "context": st.text(min_size=1, max_size=20),
            "proposed_at": st.just("2026-11-29T12:00:00Z"),
        },
        optional={
            "format": st.sampled_from(["native", "openai", "anthropic", "mcp", "x"]),
            "call": json_values,
            "idempotency_key": json_values,
            "extra": json_values,
        },
    )
    return native | st.dictionaries(st.text(max_size=10), json_values, max_size=6)


def check_one_result(raw: bytes) -> None:
    emits = on_proposed(raw, source=SOURCE, catalog=catalog, limits=LIMITS, now=NOW, trace_id=None)
    kinds = [type(e.value) for e in emits]
    assert kinds in ([ValidatedCall], [Outcome], [DeadLetter], [DeadLetter, Outcome])
    parsed = parse_envelope(raw, LIMITS)
    if isinstance(parsed, ProposedCall):
        result = validate(parsed, catalog, LIMITS)
        assert isinstance(result, Validated | Rejection)
    else:
        assert isinstance(parsed, Malformed)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    check_one_result(raw)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_never_raises(value: Any) -> None:
    check_one_result(json.dumps(value).encode())


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes())
def test_envelope_shaped_json_never_raises(value: dict[str, Any]) -> None:
    check_one_result(json.dumps(value).encode())


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["payment_id", "amount_minor", "reason", "tenant_id"]),
        json_values,
        max_size=4,
    )
)
def test_only_exact_schema_passes(arguments: dict[str, Any]) -> None:
    call = ProposedCall(
        call_id="c", tool="propose_refund", arguments=arguments, context="t", proposed_at=NOW
    )
    result = validate(call, catalog, LIMITS)
    if isinstance(result, Validated):
        assert set(arguments) == {"payment_id", "amount_minor", "reason"}
        assert type(arguments["amount_minor"]) is int
        assert arguments["amount_minor"] > 0
    else:
        assert result.fields
