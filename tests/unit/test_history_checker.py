"""The chaos suites' history checker (tests/e2e/history.py): an operation turned away before any
effect with "try again later" and then retried to success is one operation ending once; two
different settled endings of real attempts are still a violation."""

from __future__ import annotations

from typing import Any

from tests.e2e.history import History


def outcome(status: str, code: str | None = None) -> dict[str, Any]:
    return {"status": status, "error": {"code": code} if code else None}


def test_a_breaker_refusal_then_a_success_of_the_retry_is_no_violation() -> None:
    history = History(
        proposed={"c1": "op", "c2": "op"},
        effects={"op": 1},
        outcomes={"c1": [outcome("rejected", "unavailable")], "c2": [outcome("succeeded")]},
    )
    assert history.problems(settled=True) == []


def test_two_real_endings_of_one_operation_are_a_violation() -> None:
    history = History(
        proposed={"c1": "op", "c2": "op"},
        effects={"op": 1},
        outcomes={"c1": [outcome("failed", "provider_error")], "c2": [outcome("succeeded")]},
    )
    assert "operation op ended differently: ['failed', 'succeeded']" in history.problems(
        settled=True
    )


def test_an_applied_refund_reported_failed_is_a_violation_whatever_the_code() -> None:
    for code in ("retry_exhausted", "permanent_error", "timeout"):
        history = History(
            proposed={"c1": "op"},
            effects={"op": 1},
            outcomes={"c1": [outcome("unknown", "timeout"), outcome("failed", code)]},
        )
        assert f"failed ({code}) although applied downstream: c1" in history.problems(settled=True)


def test_an_escalation_is_unknown_and_the_human_resolution_settles_it() -> None:
    escalated = [outcome("unknown", "timeout"), outcome("unknown", "retry_exhausted")]
    history = History(proposed={"c1": "op"}, effects={"op": 1}, outcomes={"c1": escalated})
    assert history.problems(settled=True) == ["still unknown: c1"]
    history.outcomes["c1"] = [*escalated, outcome("succeeded")]
    assert history.problems(settled=True) == []


def test_a_conflicting_reuse_of_an_applied_key_is_no_violation() -> None:
    history = History(
        proposed={"c1": "op", "c2": "op"},
        effects={"op": 1},
        outcomes={"c1": [outcome("succeeded")], "c2": [outcome("conflict", "conflict")]},
    )
    # The conflict answers c2's reuse of the key, not whether the effect happened.
    assert all("although applied" not in p for p in history.problems(settled=True))
