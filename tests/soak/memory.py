"""The soak's memory check (pure): does a process's resident memory keep growing under load
once the warm-up is over?

A leak under constant load grows memory in proportion to the records handled, so it shows as
a steady slope; a worker taking over a killed peer's partitions steps up once and stays
there (docs/reliability.md, "Soak"), which the warm-up is there to leave out. The warm-up
scales with the run (it ends after one restart of each worker kind, see
:func:`warmup_seconds`), so the check means the same at any duration; the judgement is the
growth the fitted slope would give over :data:`REFERENCE_SECONDS` of load, against the
memory at the start of the window, so that a short run and `make soak` share one bound.
A process with too few samples after the warm-up (too short a run, or a sampler that
stopped) is a failure, never a pass: nothing was compared.
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


def warmup_seconds(soak_seconds: float) -> float:
    """The load's first seconds left out of the memory check: until an executor and a
    streams worker were each restarted once (every surviving worker has then taken over its
    peer's partitions, and its buffers and table, once), plus half the restart period (at
    most 30 s) for the rebalance to settle: 45 % of a ten-minute soak, 50 % of a
    three-minute one."""
    every = restart_every(soak_seconds)
    return 2 * every + min(30.0, every / 2)


def shortest_soak() -> int:
    """The shortest RATIFIER_SOAK_SECONDS that leaves :data:`MIN_SAMPLES` samples after the
    warm-up."""
    seconds = 20
    while seconds - warmup_seconds(seconds) < (MIN_SAMPLES + 1) * SAMPLE_EVERY:
        seconds += 1
    return seconds


@dataclass(frozen=True)
class Growth:
    process: str
    samples: int
    window: tuple[float, float]  # seconds of load, first and last sample judged
    start_mib: float  # median of the window's first five samples
    end_mib: float  # median of its last five
    slope_kib_per_s: float  # least squares over every sample of the window
    projected_percent: float  # the slope over REFERENCE_SECONDS, in % of start_mib

    @property
    def growth_percent(self) -> float:
        """Growth from the window's start to its end (medians of five samples each)."""
        return 100 * (self.end_mib - self.start_mib) / self.start_mib if self.start_mib else 0.0


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over t."""
    ts = [t for t, _ in points]
    ys = [y for _, y in points]
    t_mean, y_mean = statistics.fmean(ts), statistics.fmean(ys)
    spread = sum((t - t_mean) ** 2 for t in ts)
    if spread == 0:
        return 0.0
    return sum((t - t_mean) * (y - y_mean) for t, y in zip(ts, ys, strict=True)) / spread


def growth_of(process: str, points: Sequence[tuple[float, int]]) -> Growth:
    """``points``: (seconds of load, VmRSS KiB), in time order, at least two."""
    kib = [(t, float(v)) for t, v in points]
    start = statistics.median(v for _, v in kib[:5])
    end = statistics.median(v for _, v in kib[-5:])
    per_s = slope(kib)
    return Growth(
        process=process,
        samples=len(kib),
        window=(kib[0][0], kib[-1][0]),
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
) -> tuple[dict[str, Growth], list[str]]:
    """Each of ``processes`` judged on its samples (seconds of load, VmRSS KiB) from
    ``start`` to ``end``: the growths, and what fails (a growth at or over the limit, too
    few samples to judge, no process at all)."""
    problems: list[str] = []
    growths: dict[str, Growth] = {}
    if not processes:
        problems.append("no process to judge: every worker was restarted or never sampled")
    for name in sorted(processes):
        window = sorted((t, kib) for t, kib in series.get(name, ()) if start <= t <= end)
        if len(window) < MIN_SAMPLES:
            problems.append(
                f"{name}: {len(window)} memory samples from {start:.0f} s to {end:.0f} s of "
                f"load (after the warm-up), at least {MIN_SAMPLES} needed to judge it: run "
                f"longer (RATIFIER_SOAK_SECONDS ≥ {shortest_soak()})"
            )
            continue
        growth = growths[name] = growth_of(name, window)
        if growth.projected_percent >= LIMIT_PERCENT:
            problems.append(
                f"{name}: memory grows {growth.slope_kib_per_s:,.1f} KiB/s after the warm-up, "
                f"{growth.projected_percent:.1f} % per {REFERENCE_SECONDS:.0f} s of load "
                f"(limit {LIMIT_PERCENT:.0f} %): {growth.start_mib:.1f} → "
                f"{growth.end_mib:.1f} MiB over {growth.window[0]:.0f} to {growth.window[1]:.0f} s"
            )
    return growths, problems
