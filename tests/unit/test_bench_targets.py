"""The target table of bench/RESULTS.md (issue 29), rendered from results fixtures alone:
each target's baseline, verdict, and — when not met — its floor shown by the profile of the
process that bounds it, with the next step; whatever the pipeline's processes are named."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from bench.common import middle_rate
from bench.report import NEXT_STEP, Results, floor_line, profiles, render, targets

STREAM_PROFILE = {
    "samples": [["busy samples", 900.0], ["rate per second", 100.0]],
    "categories": [["other", 0.4], ["pydantic", 0.35], ["aiokafka", 0.25]],
    "own": [["model_validate_json (pydantic/main.py)", 0.3]],
}
EXECUTOR_PROFILE = {
    "samples": [["busy samples", 700.0], ["rate per second", 100.0]],
    "categories": [["psycopg", 0.5], ["asyncio event loop", 0.3]],
    "own": [["BaseConnection._exec_command (psycopg/_connection_base.py)", 0.2]],
}
LOOP_PROFILE = {
    "samples": [["busy samples", 300.0], ["rate per second", 100.0]],
    "categories": [["ratifier runtime loop", 0.45], ["aiokafka", 0.3]],
    "own": [["record_hop (runtime/hop.py)", 0.2]],
}


def all_met() -> dict[str, Any]:
    """Every target met, by a pipeline of three stream processes and two executors."""
    rss = {
        name: {"max_mb": 120.0, "first_mb": 110.0, "end_mb": 112.0, "growth": 2 / 110}
        for name in ("streams-validator", "streams-authorizer", "streams-join", "executor0")
    }
    return {
        "plan": {"quick": False},
        "B1": 20000.0,
        "B1_cpu_us": 20.0,
        "B2": 8000.0,
        "B2_cpu_us": 110.0,
        "B3": 4000.0,
        "T1_loop": 12000.0,
        "T1_loop_cpu_us": 35.0,
        "e2e_reads": 3200.0,
        "e2e_cpu_us": 400.0,  # 3.6x B2's CPU per record
        "e2e_cpu_by_process": {
            "streams-validator": 150.0,
            "streams-authorizer": 250.0,
            "streams-join": 100.0,
            "executor0": 150.0,
            "executor1": 150.0,
        },
        "executor_nodedup": 1000.0,
        "executor_dedup": 900.0,
        "B5_grouped": 1500.0,
        "writes": 400.0,
        "auto_writes": 700.0,
        "join_hop_rate": 350.0,
        "join_request_p50_ms": 12.0,
        "join_request_p99_ms": 40.0,
        "join_decision_p50_ms": 20.0,
        "join_decision_p99_ms": 90.0,
        "B2_lat_p50": 10.0,
        "B2_lat_p99": 25.0,
        "B2r": 6000.0,  # T2 = 53 % of it
        "B2r_cpu_us": 140.0,  # 2.9x
        "B2r_lathalf_p50": 8.0,  # 1.5x
        "B2r_lathalf_p99": 20.0,  # 2.0x
        "B2r_lat50_p50": 10.0,  # the idle call 1.4x
        "idle_p50": 14.0,
        "lat_p50": 12.0,
        "lat_p99": 40.0,
        "lat_rate": 1200.0,
        "t5_short_first_ms": 60.0,
        "t5_short_second_ms": 20.0,
        "rss": rss,
        "rss_seconds": 300,
        "rss_first_s": 60,
        "latency_settings": [["B1 relay", "linger_ms=2", "fetch_max_wait_ms=500", "100 ms"]],
    }


def results(values: dict[str, Any]) -> Results:
    return Results(values=values, errors={}, timings={"step": 1.0}, total_seconds=60.0)


def target_rows(markdown: str) -> list[str]:
    section = markdown.split("## Targets (issue 29)", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][
        1:
    ]


def test_the_issue_table_has_its_fifteen_targets_with_baselines_and_verdicts() -> None:
    md = render(results(all_met()))
    rows = target_rows(md)
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [
        "T1 a stateless stage hop vs B1 (issue 16)",
        "T2 read calls end to end vs B2",
        "CPU per read call, all ratifier processes, vs B2's CPU per record",
        "T3 executor with dedup vs without (median of 3 drains; issue 16)",
        "T4 latency at 50 % of T2's load, p50 / p99 vs B2's chain",
        "latency of one call on an idle pipeline (p50, send → outcome in the client)",
        "T2 read calls end to end vs B2r (issue 46)",
        "CPU per read call, all ratifier processes, vs B2r's CPU per record (issue 46)",
        "T4 at half of T2's load vs B2r at half of its load, p50 / p99 (issue 46)",
        "one call on an idle pipeline vs B2r's p50 at 50 records/s (issue 46)",
        "auto-approved writes (no human, provider), closed loop",
        "approved writes (bot approver, provider), closed loop",
        "approval-join hop at half the auto-approved capacity (bot-approved writes, open "
        "loop), p50 / p99",
        "T5 first call after every connection was reset",
        "RSS per worker process under load (issue 16)",
    ]
    assert all(r.endswith("| **met** |") for r in rows), rows
    assert "| 19 % (faust) | ≥ 50 % | B1 20,000 rec/s | 12,000 rec/s = 60 %" in rows[0]
    assert "3,200 calls/s = 40 %" in rows[1]
    x = "\N{MULTIPLICATION SIGN}"
    assert f"400 µs = 3.6{x}" in rows[2]
    assert f"12.0 / 40.0 ms = 1.2{x} / 1.6{x}" in rows[4]
    assert f"14.0 ms = 1.4{x}" in rows[5]
    assert "B2r 6,000 rec/s" in rows[6] and "3,200 calls/s = 53 %" in rows[6]
    assert f"400 µs = 2.9{x}" in rows[7]
    assert f"12.0 / 40.0 ms = 1.5{x} / 2.0{x}" in rows[8]
    assert f"14.0 ms = 1.4{x}" in rows[9]
    assert "B5g 1,500 cmd/s" in rows[10] and "= 47 %" in rows[10]
    assert "= 27 %" in rows[11]
    assert "request 12 / 40 ms, decision 20 / 90 ms at 350.0 calls/s" in rows[12]
    assert f"60 ms = 3.0{x}" in rows[13]
    assert "Every target is met." in md
    assert "| B1 relay | linger_ms=2 | fetch_max_wait_ms=500 | 100 ms |" in md


def test_a_target_not_met_shows_the_profile_of_its_process_and_the_next_step() -> None:
    v = all_met() | {
        "T1_loop": 6000.0,  # 30 % of B1
        "profile_t1_loop": LOOP_PROFILE,
        "e2e_cpu_us": 3000.0,  # CPU target missed
        "profile_reads": {"streams-authorizer": STREAM_PROFILE, "executor1": EXECUTOR_PROFILE},
    }
    md = render(results(v))
    rows = target_rows(md)
    assert rows[0].endswith("| **not met** |") and rows[2].endswith("| **not met** |")
    floors = md.split("## Floors of the targets not met", 1)[1].split("\n## ", 1)[0]
    assert "### T1 a stateless stage hop vs B1 (issue 16): not met" in floors
    assert "the loop adds 15.0 µs per record" in floors
    assert "`record_hop (runtime/hop.py)`" in floors
    assert NEXT_STEP["ratifier runtime loop"] in floors
    # The CPU target's bounding executor is the one profiled; its floor is psycopg.
    assert (
        "### CPU per read call, all ratifier processes, vs B2's CPU per record: not met" in floors
    )
    assert "executor1 (the busiest executor process)" in floors
    assert NEXT_STEP["psycopg"] in floors
    # Met targets get no floor section.
    assert "### T3" not in floors


def test_the_busiest_process_is_profiled_whatever_the_pipeline_runs() -> None:
    v = all_met() | {
        "profile_reads": {
            "streams-validator": STREAM_PROFILE,
            "streams-authorizer": STREAM_PROFILE,
            "executor0": EXECUTOR_PROFILE,
        },
        "profile_reads_cpu_by_process": {
            "streams-validator": 100.0,
            "streams-authorizer": 400.0,
            "executor0": 300.0,
        },
    }
    found = profiles(v)
    assert found["reads-streams"][0].startswith("streams-authorizer ")
    assert found["reads-executor"][0].startswith("executor0 ")


def test_rss_over_the_limit_or_growing_is_not_met() -> None:
    grown = all_met()
    grown["rss"] = dict(grown["rss"]) | {
        "executor0": {"max_mb": 140.0, "first_mb": 100.0, "end_mb": 140.0, "growth": 0.4}
    }
    (rss,) = [t for t in targets(grown, {}) if t.name.startswith("RSS")]
    assert rss.ok is False and "executor0" in rss.floor
    big = all_met()
    big["rss"] = dict(big["rss"]) | {
        "streams-join": {"max_mb": 300.0, "first_mb": 299.0, "end_mb": 300.0, "growth": 0.003}
    }
    (rss,) = [t for t in targets(big, {}) if t.name.startswith("RSS")]
    assert rss.ok is False and "max 300 MB (streams-join)" in rss.measured


def test_a_run_that_measured_nothing_renders_dashes() -> None:
    md = render(results({}))
    rows = target_rows(md)
    assert len(rows) == 15
    assert all(r.endswith("| — |") for r in rows)
    assert "No profile was recorded" in md


def test_the_floor_line_skips_unattributed_samples() -> None:
    line = floor_line(STREAM_PROFILE, "streams")
    assert line.startswith("Floor: streams spends 35% of its busy samples in pydantic")
    assert NEXT_STEP["pydantic"] in line


def test_a_quick_run_says_so_and_survives_its_json_round_trip() -> None:
    v = all_met() | {"plan": {"quick": True}, "profile_t1_loop": LOOP_PROFILE}
    saved = results(v)
    loaded = Results(**json.loads(json.dumps(asdict(saved))))
    md = render(loaded)
    assert md == render(saved)
    assert "**Quick run**" in md and "--quick" in md


def test_a_drain_rate_leaves_out_the_first_batch_and_the_tail() -> None:
    # A relay of 2,000-record batches, one every 0.1 s, whose first batch came out after
    # 0.1 s of work: 10 batches, 20,000 records, 1 ms of CPU per batch.
    marks = [(0.1 * (i + 1), 2000 * (i + 1), 0.001 * (i + 1)) for i in range(10)]
    rate, cpu_us = middle_rate(marks, 20000)
    assert rate == pytest.approx(20000.0)  # first to last record would say 20,000 * 10/9
    assert cpu_us == pytest.approx(0.5)
    # Everything in one poll: no rate can be told.
    rate, cpu_us = middle_rate([(1.0, 500, 0.1)], 500)
    assert rate != rate and cpu_us != cpu_us


def test_waiting_in_epoll_is_not_a_floor() -> None:
    frames = {
        "categories": [["waiting in epoll (not CPU)", 0.5], ["psycopg", 0.3]],
        "own": [["EpollSelector.select (selectors.py)", 0.5]],
    }
    line = floor_line(frames, "executor0")
    assert "in psycopg" in line and "EpollSelector" not in line
