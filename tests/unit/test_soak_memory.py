"""The soak's memory check (tests/soak/memory.py) judges something at every duration the
soak runs with, fails a process that keeps growing, passes one that steps up at a kill (a
peer's partitions taken over) and stays flat, and fails (never passes) when there is too
little to judge."""

from __future__ import annotations

import pytest

from tests.soak.memory import (
    LIMIT_PERCENT,
    MIN_SAMPLES,
    SAMPLE_EVERY,
    judge_memory,
    kill_times,
    pooled_slope,
    settle_seconds,
    shortest_soak,
    slope,
    warmup_seconds,
)

MIB = 1024


def series(
    seconds: float,
    base_mib: float,
    kib_per_s: float = 0.0,
    steps: tuple[tuple[float, float], ...] = (),
) -> list[tuple[float, int]]:
    """A sample every SAMPLE_EVERY from the load's start: ``base_mib``, growing
    ``kib_per_s``, stepping up by ``mib`` at each ``(at, mib)`` of ``steps`` (over the next
    10 s, as a takeover's backlog does), with ±0.3 MiB of noise."""
    points = []
    t = 0.0
    n = 0
    while t <= seconds:
        noise = (0.3, -0.3, 0.1, -0.1)[n % 4] * MIB
        stepped = sum(mib * MIB * min(1.0, max(0.0, (t - at) / 10)) for at, mib in steps)
        points.append((t, int(base_mib * MIB + kib_per_s * t + stepped + noise)))
        t += SAMPLE_EVERY
        n += 1
    return points


def judge(soak: int, points: list[tuple[float, int]], name: str = "p") -> tuple[float, list[str]]:
    """The projected growth of ``points`` and the problems, as the soak of ``soak`` seconds
    judges them (its warm-up, its kills, its settling)."""
    growths, problems = judge_memory(
        {name: points},
        {name},
        start=warmup_seconds(soak),
        end=soak,
        kills=kill_times(soak),
        settle=settle_seconds(soak),
    )
    return (growths[name].projected_percent if name in growths else float("nan")), problems


@pytest.mark.parametrize("soak", [shortest_soak(), 120, 180, 300, 600, 1800])
def test_every_duration_the_soak_runs_with_leaves_enough_samples_after_the_warm_up(
    soak: int,
) -> None:
    warmup = warmup_seconds(soak)
    assert 0 < warmup < soak
    growths, problems = judge_memory(
        {"streams-2/stages": series(soak, 120)},
        {"streams-2/stages"},
        start=warmup,
        end=soak,
        kills=kill_times(soak),
        settle=settle_seconds(soak),
    )
    assert not problems
    assert growths["streams-2/stages"].samples >= MIN_SAMPLES


def test_a_ten_minute_soak_warms_up_as_before() -> None:
    assert warmup_seconds(600) == 270  # two restarts of 120 s, plus 30 s
    assert kill_times(600) == [120, 240, 360, 480]
    assert kill_times(180) == [36, 72, 108, 144]


@pytest.mark.parametrize("soak", [shortest_soak(), 180, 600])
def test_a_leak_of_a_record_per_call_fails_a_short_run_and_a_long_one(soak: int) -> None:
    # 60 records/s of ~1.5 KiB kept: 90 KiB/s, 26 MiB per 5 minutes on a 120 MiB process;
    # with a step at every kill besides.
    steps = tuple((k, 8.0) for k in kill_times(soak))
    projected, problems = judge(soak, series(soak, 120, kib_per_s=90, steps=steps), "executor-1")
    assert projected > LIMIT_PERCENT
    assert len(problems) == 1 and "executor-1: memory grows" in problems[0]


@pytest.mark.parametrize("soak", [shortest_soak(), 180, 600])
def test_steps_at_the_kills_then_flat_pass(soak: int) -> None:
    # A peer's partitions and their backlog taken over at each kill, in the window too:
    # +9 MiB, as the stages process of a 180 s soak did at its last kill.
    steps = tuple((k, 9.0) for k in kill_times(soak))
    projected, problems = judge(soak, series(soak, 120, steps=steps))
    assert not problems, problems
    assert abs(projected) < LIMIT_PERCENT / 3  # noise of a few samples per segment


def test_a_step_later_between_two_kills_passes_a_leak_in_steps_does_not() -> None:
    # The 180 s soak's stages process, measured: 114.8 MiB after the last kill's takeover,
    # then 115.6 from 168 s (24 s after the kill, once the restarted worker rejoined).
    flat = [(t, kib) for t, kib in series(180, 114.8) if t < 168]
    stepped = flat + [(t, kib + int(0.8 * MIB)) for t, kib in series(180, 114.8) if t >= 168]
    assert not judge(180, stepped)[1]
    # A leak of 90 KiB/s that the allocator takes in 1 MiB steps every 11 s still fails.
    stairs = [(t, int(120 * MIB + (90 * t // MIB) * MIB)) for t, _ in series(180, 0)]
    assert judge(180, stairs)[0] > LIMIT_PERCENT


def test_too_few_samples_to_judge_fail_and_do_not_pass() -> None:
    points = series(100, 120)
    _growths, problems = judge_memory({"reconciler": points}, {"reconciler"}, start=95, end=100)
    assert len(problems) == 1 and "at least 15 needed" in problems[0]
    # A run too short for its kills and settling: every sample after the warm-up settles.
    assert "at least 15 needed" in judge(90, series(90, 120))[1][0]
    assert f"RATIFIER_SOAK_SECONDS ≥ {shortest_soak()}" in problems[0]


def test_a_process_never_sampled_or_nothing_to_judge_fails() -> None:
    _growths, problems = judge_memory(
        {"streams-2": series(300, 40)}, {"streams-2", "streams-2/stages"}, start=150, end=300
    )
    assert problems == [
        "streams-2/stages: 0 memory samples from 150 s to 300 s of load (after the warm-up, "
        f"between kills), at least {MIN_SAMPLES} needed to judge it: run longer "
        f"(RATIFIER_SOAK_SECONDS ≥ {shortest_soak()})"
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


def test_slope_is_the_median_of_the_pairwise_slopes() -> None:
    assert slope([(0, 0), (1, 2), (2, 4)]) == pytest.approx(2)
    assert slope([(5, 1), (5, 3)]) == 0
    assert slope([(0, 0), (1, 0), (2, 9), (3, 9), (4, 9), (5, 9), (6, 9)]) == 0  # one step
    # Only pairs within a segment: two flat stretches at different heights, slope 0.
    assert pooled_slope({0: [(0, 0), (1, 0)], 1: [(2, 9), (3, 9)]}) == 0
