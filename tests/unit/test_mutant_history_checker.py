"""The history checker's rules each report their violation (issue 43, `make mutants`): the
crash, replicated-cluster, chaos and partition tests rely on tests/e2e/history.py alone, and
test_history_checker.py covers its exemptions, not every rule. Here: a duplicate effect, a
lost call, a success without an effect, a call settled twice, an operation left unknown."""

from __future__ import annotations

from typing import Any

from tests.e2e.history import History


def outcome(status: str, code: str | None = None) -> dict[str, Any]:
    return {"status": status, "error": {"code": code} if code else None}


def test_an_effect_applied_twice_is_a_duplicate() -> None:
    history = History(
        proposed={"c1": "op"}, effects={"op": 2}, outcomes={"c1": [outcome("succeeded")]}
    )
    assert history.problems(settled=True) == ["duplicate effect: op applied 2 times"]


def test_a_call_without_any_outcome_is_lost_even_before_settlement() -> None:
    history = History(proposed={"c1": "op"}, effects={}, outcomes={})
    assert history.problems(settled=False) == ["lost: c1 has no outcome"]
    assert history.problems(settled=True) == ["lost: c1 has no outcome"]


def test_a_success_without_an_effect_is_a_violation() -> None:
    history = History(proposed={"c1": "op"}, effects={}, outcomes={"c1": [outcome("succeeded")]})
    assert history.problems(settled=True) == ["succeeded without an effect: c1"]


def test_two_settled_outcomes_of_one_call_are_a_violation() -> None:
    history = History(
        proposed={"c1": "op"},
        effects={"op": 1},
        outcomes={"c1": [outcome("failed", "provider_error"), outcome("succeeded")]},
    )
    assert "settled twice: c1 ['failed', 'succeeded']" in history.problems(settled=True)


def test_unknown_is_a_violation_only_once_everything_must_be_settled() -> None:
    history = History(
        proposed={"c1": "op"}, effects={}, outcomes={"c1": [outcome("unknown", "timeout")]}
    )
    assert history.problems(settled=False) == []
    assert history.problems(settled=True) == ["still unknown: c1"]


def test_a_clean_history_has_no_problem() -> None:
    history = History(
        proposed={"c1": "op", "c2": "op2"},
        effects={"op": 1},
        outcomes={
            "c1": [outcome("unknown", "timeout"), outcome("succeeded")],
            "c2": [outcome("denied", "policy_denied")],
        },
    )
    assert history.problems(settled=True) == []
