from __future__ import annotations

import json

import pytest

from commands.validate import Limits, Malformed, parse_envelope
from schemas.envelopes import CallFormat, ProposedCall


def envelope(**overrides: object) -> bytes:
    body: dict[str, object] = {
        "v": 1,
        "call_id": "c-1",
        "tool": "get_payment",
        "arguments": {"payment_id": "pay_A1001"},
        "context": "tok",
        "proposed_at": "2026-11-29T12:00:00Z",
    }
    body.update(overrides)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def test_valid_envelope_parses() -> None:
    parsed = parse_envelope(envelope(), Limits())
    assert isinstance(parsed, ProposedCall)
    assert parsed.format is CallFormat.NATIVE
    assert parsed.effective_idempotency_key == "c-1"


@pytest.mark.parametrize(
    ("raw", "reason", "call_id"),
    [
        (None, "empty record", None),
        (b"not json", "not JSON", None),
        (b"\xff\xfe", "not JSON", None),
        (b"[1,2]", "not a JSON object", None),
        (envelope(call_id=...), "missing or invalid call_id", None),
        (envelope(call_id="has space"), "missing or invalid call_id", None),
        (envelope(v=2), "unsupported or missing version 'v'", "c-1"),
        (envelope(v=...), "unsupported or missing version 'v'", "c-1"),
        (envelope(context=...), "invalid envelope field context", "c-1"),
        (envelope(surprise=1), "invalid envelope field surprise", "c-1"),
        (envelope(tool=...), "invalid envelope field", "c-1"),
    ],
)
def test_malformed_records(raw: bytes | None, reason: str, call_id: str | None) -> None:
    parsed = parse_envelope(raw, Limits())
    assert isinstance(parsed, Malformed)
    assert parsed.reason.startswith(reason)
    assert parsed.call_id == call_id


def test_oversize_record_is_malformed_and_keeps_call_id() -> None:
    raw = envelope(arguments={"payment_id": "pay_1", "pad": "x" * 70_000})
    parsed = parse_envelope(raw, Limits())
    assert parsed == Malformed(reason="record too large", call_id="c-1")


def test_pathological_nesting_is_malformed_without_crashing() -> None:
    deep = b'{"v":1,"call_id":"c-9","arguments":' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    parsed = parse_envelope(deep, Limits(max_record_bytes=1_000_000))
    assert isinstance(parsed, Malformed)
    assert parsed.reason == "nesting too deep"
    assert parsed.call_id == "c-9"


def test_provider_format_needs_call() -> None:
    parsed = parse_envelope(envelope(format="openai", tool=..., arguments=...), Limits())
    assert isinstance(parsed, Malformed)
