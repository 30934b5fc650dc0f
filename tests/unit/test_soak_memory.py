"""The soak's memory check (tests/soak/memory.py) judges something at every duration the
soak runs with, fails a process that keeps growing, passes one that stepped up once during
the warm-up and stays flat, and fails (never passes) when there is too little to judge."""

from __future__ import annotations

import pytest

from tests.soak.memory import (
    LIMIT_PERCENT,
    MIN_SAMPLES,
    SAMPLE_EVERY,
    judge_memory,
    shortest_soak,
    slope,
    warmup_seconds,
)

MIB = 1024


def series(
    seconds: float, base_mib: float, kib_per_s: float = 0.0, step: tuple[float, float] = (0, 0)
) -> list[tuple[float, int]]:
    """A sample every SAMPLE_EVERY from the load's start: ``base_mib``, growing
    ``kib_per_s``, stepping up by ``step[1]`` MiB at ``step[0]`` s, with ±0.3 MiB of noise."""
    points = []
    t = 0.0
    n = 0
    while t <= seconds:
        noise = (0.3, -0.3, 0.1, -0.1)[n % 4] * MIB
        stepped = step[1] * MIB if step[1] and t >= step[0] else 0.0
        points.append((t, int(base_mib * MIB + kib_per_s * t + stepped + noise)))
        t += SAMPLE_EVERY
        n += 1
    return points


@pytest.mark.parametrize("soak", [shortest_soak(), 120, 180, 300, 600, 1800])
def test_every_duration_the_soak_runs_with_leaves_enough_samples_after_the_warm_up(
    soak: int,
) -> None:
    warmup = warmup_seconds(soak)
    assert 0 < warmup < soak
    growths, problems = judge_memory(
        {"streams-2/stages": series(soak, 120)}, {"streams-2/stages"}, start=warmup, end=soak
    )
    assert not problems
    assert growths["streams-2/stages"].samples >= MIN_SAMPLES


def test_a_ten_minute_soak_warms_up_as_before() -> None:
    assert warmup_seconds(600) == 270  # two restarts of 120 s, plus 30 s


@pytest.mark.parametrize("soak", [120, 180, 600])
def test_a_leak_of_a_record_per_call_fails_a_short_run_and_a_long_one(soak: int) -> None:
    # 60 records/s of ~1.5 KiB kept: 90 KiB/s, 26 MiB per 5 minutes on a 120 MiB process.
    growths, problems = judge_memory(
        {"executor-1": series(soak, 120, kib_per_s=90)},
        {"executor-1"},
        start=warmup_seconds(soak),
        end=soak,
    )
    assert growths["executor-1"].projected_percent > LIMIT_PERCENT
    assert len(problems) == 1 and "executor-1: memory grows" in problems[0]


def test_a_step_during_the_warm_up_then_flat_passes() -> None:
    # The takeover of a killed peer's partitions: +12 MiB at the streams kill (72 s).
    growths, problems = judge_memory(
        {"streams-2/stages": series(180, 120, step=(75, 12))},
        {"streams-2/stages"},
        start=warmup_seconds(180),
        end=180,
    )
    assert not problems, problems
    assert abs(growths["streams-2/stages"].projected_percent) < 1


def test_too_few_samples_to_judge_fail_and_do_not_pass() -> None:
    points = series(100, 120)
    _growths, problems = judge_memory({"reconciler": points}, {"reconciler"}, start=95, end=100)
    assert len(problems) == 1 and "at least 15 needed" in problems[0]
    assert f"RATIFIER_SOAK_SECONDS ≥ {shortest_soak()}" in problems[0]


def test_a_process_never_sampled_or_nothing_to_judge_fails() -> None:
    _growths, problems = judge_memory(
        {"streams-2": series(300, 40)}, {"streams-2", "streams-2/stages"}, start=150, end=300
    )
    assert problems == [
        "streams-2/stages: 0 memory samples from 150 s to 300 s of load (after the warm-up), "
        f"at least {MIN_SAMPLES} needed to judge it: run longer (RATIFIER_SOAK_SECONDS ≥ "
        f"{shortest_soak()})"
    ]
    assert judge_memory({}, set(), start=0, end=1)[1] == [
        "no process to judge: every worker was restarted or never sampled"
    ]


def test_samples_outside_the_window_are_not_judged() -> None:
    # Growth during the warm-up and after the load (the settle) is not a leak.
    points = [(t, kib) for t, kib in series(400, 100, kib_per_s=500) if t < 150]
    points += [*series(300, 200)[75:], (310.0, 900 * MIB)]
    _growths, problems = judge_memory({"p": points}, {"p"}, start=150, end=300)
    assert not problems


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0, 0), (1, 2), (2, 4)]) == pytest.approx(2)
    assert slope([(5, 1), (5, 3)]) == 0
