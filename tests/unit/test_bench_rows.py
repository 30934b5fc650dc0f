"""Bench rows that can fail, and only from this run (issue 43): T6's duplicate count over
reads and writes (bench/duplicates.py), the run id that ties a result file or the flood's
figures to the run they are shown with (bench/provenance.py, bench/report.py), and the
flood's figures read from the output of the run that measured them (bench/flood.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import approval_state
from bench import idle as idle_bench
from bench import operator_commands as operator_bench
from bench import replies as replies_bench
from bench.duplicates import Call, count_duplicates
from bench.flood import figures_of, verdict_of
from bench.provenance import current_run_id, new_run_id, not_this_run, stamped
from bench.report import Results, _admission_section, flood_of, render, t6_verdict

TAG = "k-abc123"


def history() -> tuple[dict[str, Call], dict[str, set[tuple[str, str | None]]]]:
    """Two reads, and refunds of two keys, the first retried by another call: all settled
    once, as a correct run ends."""
    calls = {
        f"{TAG}-r0": Call("read", f"{TAG}-r0"),
        f"{TAG}-r1": Call("read", f"{TAG}-r1"),
        f"{TAG}-w0": Call("write", f"{TAG}-key0"),
        f"{TAG}-w0-again": Call("write", f"{TAG}-key0"),
        f"{TAG}-w1": Call("write", f"{TAG}-key1"),
    }
    ok: tuple[str, str | None] = ("succeeded", None)
    # A redelivered read answered twice alike, and a refund first `unknown` (reconciled):
    # neither is a duplicate.
    finals: dict[str, set[tuple[str, str | None]]] = {
        f"{TAG}-r0": {ok},
        f"{TAG}-r1": {ok},
        f"{TAG}-w0": {ok},
        f"{TAG}-w0-again": {ok},
        f"{TAG}-w1": {("unknown", None), ok},
    }
    return calls, finals


EFFECTS = {f"tenant-a:{TAG}-key0": 1, f"tenant-a:{TAG}-key1": 1, "tenant-a:w-other-7": 1}
LEDGER = [(f"{TAG}-w0", f"{TAG}-key0"), (f"{TAG}-w1", f"{TAG}-key1")]


def test_a_correct_history_has_no_duplicate() -> None:
    calls, finals = history()
    found = count_duplicates(calls, finals, EFFECTS, LEDGER)
    assert found.duplicates == 0 and found.effects_match and found.unsettled == 0
    assert (found.calls, found.writes, found.keys, found.effects) == (5, 3, 2, 2)


def test_an_effect_applied_under_each_call_of_one_key_is_counted() -> None:
    # The key lost on the way (the retry filed under its call id): the provider, which
    # deduplicates per name, applied it twice; the ledger holds two entries for one key.
    calls, finals = history()
    effects = {**EFFECTS, f"tenant-a:{TAG}-w0-again": 1}
    ledger = [*LEDGER, (f"{TAG}-w0-again", f"{TAG}-w0-again")]
    found = count_duplicates(calls, finals, effects, ledger)
    assert found.effects_applied_twice == 1
    assert found.ledger_entries_twice == 1
    assert found.duplicates == 2


def test_a_call_settled_twice_is_counted_for_a_read_and_for_a_write() -> None:
    calls, finals = history()
    finals[f"{TAG}-r1"] = {("succeeded", None), ("failed", "executor_error")}
    finals[f"{TAG}-w0-again"] = {("conflict", "fingerprint_mismatch")}
    found = count_duplicates(calls, finals, EFFECTS, LEDGER)
    assert found.settled_twice == 1
    assert found.keys_settled_differently == 2  # r1's own key, and key0's two calls
    assert found.duplicates == 3


def test_effects_and_outcomes_that_disagree_and_unsettled_calls_are_counted() -> None:
    calls, finals = history()
    finals[f"{TAG}-w1"] = {("unknown", None)}  # never reconciled
    effects = {f"tenant-a:{TAG}-key1": 1}  # key0 succeeded without an effect
    found = count_duplicates(calls, finals, effects, LEDGER)
    assert found.unsettled == 1
    assert found.applied_not_succeeded == 1  # key1 applied, never reported succeeded
    assert found.succeeded_not_applied == 1
    assert not found.effects_match and found.duplicates == 0


def test_a_new_run_id_is_unique_and_sortable_by_time() -> None:
    a, b = new_run_id(), new_run_id()
    assert a != b and a[:8].isdigit() and a[8] == "T"


def test_a_result_file_is_shown_only_with_the_run_it_was_measured_with() -> None:
    mine = stamped({"command": "x"}, run_id="r1")
    assert {"commit", "host", "written"} <= set(mine)
    assert not_this_run(mine, "r1", file="f.json", command="make x") is None
    other = not_this_run(mine, "r2", file="f.json", command="make x")
    assert other is not None and "belongs to run r1" in other and "make x" in other
    old = not_this_run({"finished": "2026-11-29"}, "r1", file="f.json", command="make x")
    assert old is not None and "carries no run id" in old and "2026-11-29" in old
    missing = not_this_run(None, "r1", file="f.json", command="make x")
    assert missing is not None and "missing" in missing
    assert not_this_run(mine, None, file="f.json", command="make x") is not None


def test_the_run_id_is_read_from_the_results_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    assert current_run_id(path) is None
    Results(values={"run_id": "r9"}, errors={}, timings={}, total_seconds=1.0).save(path)
    assert current_run_id(path) == "r9"
    Results(values={}, errors={}, timings={}, total_seconds=1.0).save(path)
    assert current_run_id(path) is None


ADMISSION = {
    "admission_plain_cpu_us": 43.0,
    "admission_admitted_cpu_us": 51.0,
    "admission_refused_cpu_us": 73.0,
    "admission_cost_admitted_us": 8.0,
    "admission_cost_refused_us": 30.0,
    "e2e_cpu_us": 1167.0,
}
FLOOD = {"flood": 2000, "b_alone_p50_ms": 74.0, "b_flood_p50_ms": 740.0, "test": "passed"}


def _noisy(values: dict[str, Any], errors: dict[str, str] | None = None) -> str:
    return next(line for line in _admission_section(values, errors) if "noisy neighbour" in line)


def test_the_noisy_neighbour_row_shows_only_this_runs_flood() -> None:
    this_run = {**ADMISSION, "run_id": "r1", "flood": {**FLOOD, "run_id": "r1"}}
    assert flood_of(this_run)[0] is not None
    row = _noisy(this_run)
    assert "10.00" in row and "**not met**" in row
    # Another run's figures, figures without a run (a file an older bench copied), none.
    for values in (
        {**ADMISSION, "run_id": "r2", "flood": {**FLOOD, "run_id": "r1"}},
        {**ADMISSION, "noisy_neighbour": FLOOD, "flood": FLOOD},
        {**ADMISSION, "run_id": "r2"},
    ):
        row = _noisy(values)
        assert "not measured in this run (make test-admission-flood)" in row, row
        assert "10.00" not in row and "met**" not in row
    failed = _noisy({**ADMISSION, "run_id": "r2"}, {"noisy neighbour: flood": "TimeoutError"})
    assert "the step failed: TimeoutError" in failed


def test_the_flood_figures_come_from_the_output_of_the_run_that_measured_them() -> None:
    out = (
        "....\nadmission figures: " + json.dumps({"flood": 5, "b_alone_p50_ms": 1.0}) + "\n"
        "E       AssertionError: {'flood': 5}\nE       assert 1.19 <= 1.0\n1 failed\n"
    )
    assert figures_of(out) == {"flood": 5, "b_alone_p50_ms": 1.0}
    assert figures_of("1 passed\n") is None
    assert figures_of("admission figures: {not json\n") is None
    assert verdict_of(out, 1).startswith("failed (exit 1): E       AssertionError")
    assert verdict_of(out, 0) == "passed"


def t6(**dup: Any) -> dict[str, Any]:
    counts = {
        "calls": 900,
        "writes": 100,
        "keys": 80,
        "effects": 80,
        "effects_applied_twice": 0,
        "ledger_entries_twice": 0,
        "settled_twice": 0,
        "keys_settled_differently": 0,
        "applied_not_succeeded": 0,
        "succeeded_not_applied": 0,
        "unsettled": 0,
        "duplicates": 0,
    }
    return {"t6_recovered_s": 7, "t6_complete": True, "t6_duplicates": counts | dup}


@pytest.mark.parametrize(
    "values",
    [
        t6(effects_applied_twice=1, duplicates=1),
        t6(settled_twice=2, duplicates=2),
        t6(unsettled=1),
        t6(succeeded_not_applied=1),
        t6(writes=0),  # no refund: nothing could be applied twice, nothing was shown
        t6() | {"t6_recovered_s": 31},
        t6() | {"t6_complete": False},
    ],
)
def test_t6_fails_on_a_duplicate_a_lost_call_or_no_writes(values: dict[str, Any]) -> None:
    assert t6_verdict(values)[0] is False


def test_t6_is_met_on_a_clean_run_and_not_judged_without_its_figures() -> None:
    ok, measured = t6_verdict(t6())
    assert ok is True and "effects applied twice 0" in measured
    # A run from before the count (only the old always-0 figures): not this run's T6.
    assert t6_verdict({"t6_recovered_s": 7, "t6_dup_ledger": 0})[0] is None


def test_the_report_shows_separate_runs_only_with_their_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        idle_bench: {"command": "idle", "idle_seconds": 1800, "first": {"outcome_ms": 50.0}},
        approval_state: None,
        replies_bench: None,
        operator_bench: None,
    }
    for module, content in files.items():
        path = tmp_path / f"{module.__name__}.json"
        if content is not None:
            path.write_text(json.dumps(stamped(content, run_id="r1")), encoding="utf-8")
        monkeypatch.setattr(module, "RESULT_FILE", path)
    md = render(Results(values={"run_id": "r1"}, errors={}, timings={}, total_seconds=1.0))
    idle = md.split("## T5 after a real 30-minute idle", 1)[1].split("\n## ", 1)[0]
    assert "first call 50 ms" in idle and "**met**" in idle and "host" in idle
    for heading, command in (
        ("## Approval-join state", "make bench-approvals"),
        ("## Reply routing", "make bench-replies"),
        ("## Operator commands", "make bench-operators"),
    ):
        section = md.split(heading, 1)[1].split("\n## ", 1)[0]
        assert "— not measured with this run" in section and command in section
    # The same idle file beside another run: a dash and the run it belongs to.
    other = render(Results(values={"run_id": "r2"}, errors={}, timings={}, total_seconds=1.0))
    idle = other.split("## T5 after a real 30-minute idle", 1)[1].split("\n## ", 1)[0]
    assert "belongs to run r1" in idle and "first call" not in idle


def test_the_flood_step_takes_its_figures_from_its_own_child_not_the_file_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import sys

    from bench import flood
    from bench.admission import FLOOD_FIGURES

    monkeypatch.chdir(tmp_path)
    FLOOD_FIGURES.parent.mkdir(parents=True)
    FLOOD_FIGURES.write_text(json.dumps({"flood": 99, "b_alone_p50_ms": 1.0}))  # a decoy
    printed = {"flood": 7, "b_alone_p50_ms": 20.0, "b_flood_p50_ms": 30.0}
    child = f"import json; print('admission figures: ' + json.dumps({printed!r}))"
    monkeypatch.setattr(flood, "COMMAND", (sys.executable, "-c", child))
    found = asyncio.run(flood.noisy_neighbour(7, False, "r1"))["flood"]
    assert found["flood"] == 7 and found["b_flood_p50_ms"] == 30.0
    assert found["run_id"] == "r1" and found["test"] == "passed"
    monkeypatch.setattr(flood, "COMMAND", (sys.executable, "-c", "print('1 failed')"))
    with pytest.raises(RuntimeError, match="printed no figures"):
        asyncio.run(flood.noisy_neighbour(7, False, "r2"))


def test_t6_without_its_recovery_time_judges_only_what_was_done_twice() -> None:
    from bench.report import t6_correct

    assert t6_correct(t6() | {"t6_recovered_s": None}) is True  # slow to recover: still correct
    assert t6_correct(t6(effects_applied_twice=1, duplicates=1)) is False
    assert t6_correct(t6(succeeded_not_applied=1)) is False
    assert t6_correct({"t6_recovered_s": 7}) is None
