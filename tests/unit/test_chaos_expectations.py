"""The expectations of `make chaos` and `make partitions` (tests/chaos/expectations.py): each
acknowledged call's final outcome by kind, the minimums of a load, and what makes a row fail."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from tests.chaos import expectations
from tests.chaos.expectations import Answer

OK: Answer = ("succeeded", None)


def outcome(status: str, code: str | None = None) -> dict[str, Any]:
    return {"status": status, "error": {"code": code} if code else None}


def test_final_answers_ignore_what_is_not_final_and_repeats() -> None:
    seen = [
        outcome("awaiting_approval", "approval_required"),
        outcome("unknown", "timeout"),
        outcome("succeeded"),
        outcome("succeeded"),  # a repeat after a crash
    ]
    assert expectations.final_answers(seen) == {OK}
    assert expectations.final_answers([outcome("unknown", "retry_exhausted")]) == set()


@pytest.mark.parametrize(
    ("kind", "got"),
    [
        ("read", OK),
        ("duplicate", OK),
        ("invalid", ("rejected", "invalid_arguments")),
        ("foreign", ("denied", "not_found")),
        ("refund", OK),
        ("refund", ("rejected", "rate_limited")),
        ("refund", ("rejected", "unavailable")),
        ("refund_retry", ("rejected", "unavailable")),
    ],
)
def test_what_the_contract_answers_is_expected(kind: str, got: Answer) -> None:
    assert got in expectations.expected(kind)
    assert not expectations.unexpected({"c": kind}, {"c": {got}})


@pytest.mark.parametrize(
    ("kind", "got"),
    [
        ("read", ("rejected", "rate_limited")),  # reads are admitted even with Redis away
        ("read", ("denied", "not_found")),
        ("duplicate", ("conflict", "conflict")),
        ("invalid", OK),  # an injected tenant_id that ran
        ("invalid", ("denied", "not_found")),  # the right status family, not the contract
        ("foreign", OK),  # another tenant's payment shown
        ("foreign", ("denied", "policy_denied")),
        ("refund", ("expired", "approval_expired")),
        ("refund", ("failed", "retry_exhausted")),  # only where the provider fails
        ("refund", ("denied", "frozen")),  # nothing is frozen in these experiments
        ("refund", ("rejected", "approval_rejected")),
        ("refund", ("rejected", None)),  # a refusal without its code
        ("refund_retry", ("conflict", "conflict")),
    ],
)
def test_anything_else_is_unexpected(kind: str, got: Answer) -> None:
    found = expectations.unexpected({"c": kind}, {"c": {got}})
    assert found == {f"{kind}:{expectations.label(got)}": 1}


def test_a_failing_provider_allows_retry_exhausted_for_refunds_only() -> None:
    gave_up: Answer = ("failed", "retry_exhausted")
    calls = {"r": "refund", "t": "refund_retry", "q": "read"}
    finals = {"r": {gave_up}, "t": {gave_up}, "q": {gave_up}}
    assert expectations.unexpected(calls, finals, provider_fails=True) == {
        "read:failed/retry_exhausted": 1
    }
    assert expectations.unexpected(calls, finals).total() == 3


def test_a_call_with_two_answers_counts_each_wrong_one_and_a_lost_one_none() -> None:
    calls = {"a": "read", "b": "read"}
    finals = {"a": {OK, ("denied", "not_found")}}  # b: no final answer (counted as lost)
    assert expectations.unexpected(calls, finals) == {"read:denied/not_found": 1}
    table = expectations.answers_by_kind(calls, finals)
    assert table["read"] == {"denied/not_found": 1, "none": 1, "succeeded": 1}
    assert table["refund"] == {}


def test_minimums_scale_with_the_plan_and_are_never_zero() -> None:
    least = expectations.minimums(900)
    assert least["acknowledged"] == 675
    assert least["refund"] == 67 and least["foreign"] == 22
    assert least["provider_effects"] == 67
    assert set(expectations.minimums(0).values()) == {1}
    assert sum(expectations.SHARES.values()) == pytest.approx(1.0)
    assert set(expectations.SHARES) == set(expectations.KINDS)


def test_sending_or_applying_nothing_falls_short() -> None:
    full = {"read": 490, "duplicate": 90, "invalid": 90, "foreign": 45, "refund": 135}
    full["refund_retry"] = 45
    assert expectations.shortfalls(900, full, effects=130) == []
    nothing = expectations.shortfalls(900, {}, effects=0)
    assert "0 calls acknowledged of 900 planned < 675" in nothing
    assert "0 provider effects < 67" in nothing
    assert len(nothing) == 2 + len(expectations.KINDS)
    no_foreign = expectations.shortfalls(900, {**full, "foreign": 3}, effects=130)
    assert no_foreign == ["3 foreign calls acknowledged < 22"]
    assert expectations.shortfalls(900, full, effects=20) == ["20 provider effects < 67"]


def clean_row() -> dict[str, Any]:
    return {
        "lost": 0,
        "duplicate_effects": 0,
        "two_final_outcomes": 0,
        "history_problems": 0,
        "effects_equal_ledger": True,
        "streams_commit_lag": {},
        "unexpected_outcomes": {},
        "shortfalls": [],
    }


def test_violations_include_unexpected_outcomes_and_shortfalls() -> None:
    assert expectations.violations(clean_row()) == []
    wrong = {**clean_row(), "unexpected_outcomes": {"refund:expired/approval_expired": 3}}
    assert expectations.violations(wrong) == [
        "unexpected outcomes {'refund:expired/approval_expired': 3}"
    ]
    short = {**clean_row(), "shortfalls": ["0 provider effects < 67"]}
    assert expectations.violations(short) == ["too little: 0 provider effects < 67"]
    lagging = {**clean_row(), "streams_commit_lag": {"g/t[0]": 4}, "effects_equal_ledger": False}
    assert len(expectations.violations(lagging)) == 2


def test_the_load_mix_has_the_shares_the_minimums_assume() -> None:
    """MixedLoad.next_call's thresholds and expectations.SHARES describe the same mix: over a
    full experiment's plan every kind comes within 0.6-1.4 of its share (seeded draws: the
    same counts in every run), so the per-kind minimums (half the share) hold with room."""
    from tests.chaos.test_chaos import EXPERIMENTS, MixedLoad

    for name in [n for n, _ in EXPERIMENTS][:3]:
        load = object.__new__(MixedLoad)
        load.calls = {}
        load.reader_ctx = load.refund_ctx = "token"
        rng = random.Random(name)
        for n in range(899):
            load.next_call(name, n, rng)
        made = Counter(call.kind for call in load.calls.values())
        assert set(made) == set(expectations.KINDS)
        for kind, share in expectations.SHARES.items():
            assert 0.6 <= made[kind] / (share * 900) <= 1.4, (name, kind, made[kind])
