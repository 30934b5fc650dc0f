"""The soak's memory check (pure): does a process's resident memory keep growing under load
once the warm-up is over?

A leak under constant load grows memory in proportion to the records handled, so it shows as
a steady slope. A worker taking over a killed peer's partitions (and the backlog the kill
left) steps its memory up at the kill and stays there (docs/reliability.md, "Soak"): a high
water mark, not a leak, and the soak kills a worker every restart period, during the
measurement too. So the slope is fitted *between* kills: the samples after the warm-up are
cut into segments at each kill, the first seconds after a kill (the rebalance and its
backlog, :func:`settle_seconds`) are left out, and the slope is the median of the slopes
between every two samples of a segment (Theil-Sen): a step at a kill falls between two
segments, and a step later in a segment (the restarted worker rejoining) is crossed by at
most about half of its pairs, so it moves the median little; a leak raises every pair. The
judgement is the growth that slope gives over :data:`REFERENCE_SECONDS` of load, against the
memory at the start of the window, so a short run and `make soak` share one bound; the
warm-up and the settling scale with the run (:func:`warmup_seconds`). A process with too few
samples to judge (too short a run, or never sampled) is a failure, never a pass: nothing was
compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

SAMPLE_EVERY = 2.0  # seconds between two samples of every process's VmRSS
MIN_SAMPLES = 15  # after the warm-up, per process judged
# The growth judged: what the slope gives over this much load, in % of the memory at the
# start of the window (about the window of a ten-minute `make soak`).
REFERENCE_SECONDS = 300.0
LIMIT_PERCENT = 10.0


def restart_every(soak_seconds: float) -> float:
    """Seconds between two kills (an executor, then a streams worker, alternately)."""
    return float(min(120, max(20, int(soak_seconds) // 5)))


def settle_seconds(soak_seconds: float) -> float:
    """Seconds after a kill left out of the memory check: half the restart period, at most
    30 s (the session timeout, the rebalance, the new worker's start and the backlog)."""
    return min(30.0, restart_every(soak_seconds) / 2)


def kill_times(soak_seconds: float) -> list[float]:
    """When the soak kills a worker, in seconds of load."""
    every = restart_every(soak_seconds)
    return [every * k for k in range(1, int(soak_seconds // every) + 1) if every * k < soak_seconds]


def warmup_seconds(soak_seconds: float) -> float:
    """The load's first seconds left out of the memory check: until an executor and a
    streams worker were each restarted once (every surviving worker has then taken over its
    peer's partitions, and its buffers and table, once), plus half the restart period (at
    most 30 s) for the rebalance to settle: 45 % of a ten-minute soak, 50 % of a
    three-minute one."""
    return 2 * restart_every(soak_seconds) + settle_seconds(soak_seconds)


def judged_times(
    times: Sequence[float], *, start: float, end: float, kills: Sequence[float], settle: float
) -> list[tuple[int, float]]:
    """(segment, time) of the sample times judged: from ``start`` to ``end``, none within
    ``settle`` seconds after a kill; the segment is the number of kills before the time."""
    judged = []
    for t in times:
        if not start <= t <= end or any(k <= t < k + settle for k in kills):
            continue
        judged.append((sum(1 for k in kills if k <= t), t))
    return judged


def shortest_soak() -> int:
    """The shortest RATIFIER_SOAK_SECONDS that leaves :data:`MIN_SAMPLES` samples to judge
    after the warm-up, between the kills."""
    seconds = 20
    while True:
        samples = [n * SAMPLE_EVERY for n in range(int(seconds / SAMPLE_EVERY) + 1)]
        judged = judged_times(
            samples,
            start=warmup_seconds(seconds),
            end=seconds,
            kills=kill_times(seconds),
            settle=settle_seconds(seconds),
        )
        if len(judged) >= MIN_SAMPLES + 1:  # a sample's time can fall either side
            return seconds
        seconds += 1


@dataclass(frozen=True)
class Growth:
    process: str
    samples: int
    segments: int  # stretches between kills the samples fell in
    window: tuple[float, float]  # seconds of load, first and last sample judged
    start_mib: float  # median of the window's first five samples
    end_mib: float  # median of its last five
    slope_kib_per_s: float  # median of the slopes within each segment, pooled
    projected_percent: float  # the slope over REFERENCE_SECONDS, in % of start_mib

    @property
    def growth_percent(self) -> float:
        """Growth from the window's start to its end (medians of five samples each), steps
        at the kills included."""
        return 100 * (self.end_mib - self.start_mib) / self.start_mib if self.start_mib else 0.0


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Theil-Sen slope of y over t: the median of the slopes between every two points."""
    return pooled_slope({0: points})


def pooled_slope(segments: Mapping[int, Sequence[tuple[float, float]]]) -> float:
    """The median of the slopes between every two points of the same segment (Theil-Sen,
    pooled): a leak makes nearly every pair rise; a step (a buffer grown once, an arena
    taken) makes only the pairs across it rise, about half of a segment's at most."""
    slopes = [
        (y2 - y1) / (t2 - t1)
        for points in segments.values()
        for i, (t1, y1) in enumerate(points)
        for t2, y2 in points[i + 1 :]
        if t2 > t1
    ]
    return statistics.median(slopes) if slopes else 0.0


def growth_of(process: str, points: Sequence[tuple[int, float, int]]) -> Growth:
    """``points``: (segment, seconds of load, VmRSS KiB), in time order, at least two."""
    segments: dict[int, list[tuple[float, float]]] = {}
    for segment, t, kib in points:
        segments.setdefault(segment, []).append((t, float(kib)))
    start = statistics.median(float(kib) for _, _, kib in points[:5])
    end = statistics.median(float(kib) for _, _, kib in points[-5:])
    per_s = pooled_slope(segments)
    return Growth(
        process=process,
        samples=len(points),
        segments=len(segments),
        window=(points[0][1], points[-1][1]),
        start_mib=start / 1024,
        end_mib=end / 1024,
        slope_kib_per_s=per_s,
        projected_percent=100 * per_s * REFERENCE_SECONDS / start if start else 0.0,
    )


def judge_memory(
    series: Mapping[str, Sequence[tuple[float, int]]],
    processes: Collection[str],
    *,
    start: float,
    end: float,
    kills: Sequence[float] = (),
    settle: float = 0.0,
) -> tuple[dict[str, Growth], list[str]]:
    """Each of ``processes`` judged on its samples (seconds of load, VmRSS KiB) from
    ``start`` to ``end``, none within ``settle`` seconds after one of ``kills``: the
    growths, and what fails (a growth at or over the limit, too few samples to judge, no
    process at all)."""
    problems: list[str] = []
    growths: dict[str, Growth] = {}
    if not processes:
        problems.append("no process to judge: every worker was restarted or never sampled")
    for name in sorted(processes):
        samples = dict(series.get(name, ()))
        judged = judged_times(sorted(samples), start=start, end=end, kills=kills, settle=settle)
        if len(judged) < MIN_SAMPLES:
            problems.append(
                f"{name}: {len(judged)} memory samples from {start:.0f} s to {end:.0f} s of "
                f"load (after the warm-up, between kills), at least {MIN_SAMPLES} needed to "
                f"judge it: run longer (RATIFIER_SOAK_SECONDS ≥ {shortest_soak()})"
            )
            continue
        growth = growths[name] = growth_of(name, [(seg, t, samples[t]) for seg, t in judged])
        if growth.projected_percent >= LIMIT_PERCENT:
            problems.append(
                f"{name}: memory grows {growth.slope_kib_per_s:,.1f} KiB/s after the warm-up "
                f"(between kills), {growth.projected_percent:.1f} % per "
                f"{REFERENCE_SECONDS:.0f} s of load (limit {LIMIT_PERCENT:.0f} %): "
                f"{growth.start_mib:.1f} → {growth.end_mib:.1f} MiB over "
                f"{growth.window[0]:.0f} to {growth.window[1]:.0f} s"
            )
    return growths, problems
