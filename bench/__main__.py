"""`make bench`: every baseline and every ratifier figure in one run, on the same broker,
topics shape and envelope size, written to bench/RESULTS.md with the targets' verdicts.

This orchestrates: :mod:`bench.measure` measures (each step prints one progress line, runs
under its own time limit and, when it fails, leaves its error in the results instead of
stopping the run; the whole run stays under ``BUDGET_SECONDS``), the results are saved to
bench/results.json, and :mod:`bench.report` renders bench/RESULTS.md from them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from bench.common import RESULTS, BenchRun
from bench.measure import (
    BUDGET_SECONDS,
    Measurements,
    baseline_postgres,
    baseline_redis,
    baselines_kafka,
    chain_latency,
    executor_with_and_without_dedup,
    pure_costs,
    seed_payments,
    stages_alone,
    whole_pipeline,
)
from bench.report import COMMAND, VALUES, Results, render
from ratifier.migrate import migrate


async def measure() -> Results:
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    run = Measurements()
    n = int(os.environ.get("BENCH_N", "20000"))
    stage_n = int(os.environ.get("BENCH_STAGE_N", "4000"))
    print(
        f"bench: {COMMAND}; budget {BUDGET_SECONDS / 60:.0f} min; logs under test-artifacts/bench-logs",
        flush=True,
    )
    url = BenchRun.create("setup").settings.storage.database_url
    await asyncio.to_thread(migrate, url)
    await asyncio.to_thread(seed_payments, url)
    await run.step("pure stage costs", 120, lambda: pure_costs(5000))
    await run.step("B1 relay, B2 chain, B3 faust identity", 300, lambda: baselines_kafka(n))
    await run.step(
        "B2 latency floor (raw 4-hop chain, 50 records/s)", 120, lambda: chain_latency(50, 15)
    )
    await run.step("B4 Redis SET NX", 60, lambda: baseline_redis(5000))
    await run.step("B5 ledger transaction (psycopg)", 120, lambda: baseline_postgres(500))
    await run.step(
        "stages alone (validator, authorizer, approval-join, executor)",
        300,
        lambda: stages_alone(stage_n),
    )
    await run.step(
        "T3 executor without/with dedup (A-B-B-A)",
        300,
        lambda: executor_with_and_without_dedup(stage_n),
    )
    try:
        await asyncio.wait_for(whole_pipeline(run), timeout=max(run.left() - 20, 30))
    except Exception as exc:
        run.errors["whole pipeline"] = f"{type(exc).__name__}: {exc}"[:300]
    return run.results()


def run_all() -> int:
    results = asyncio.run(measure())
    results.save()
    RESULTS.write_text(render(results), encoding="utf-8")
    print(
        f"bench: wrote {RESULTS} in {results.total_seconds / 60:.1f} min; "
        f"{len(results.errors)} step(s) failed",
        flush=True,
    )
    return 0 if not results.errors else 1


def rerender() -> int:
    """Write RESULTS.md again from the last run's bench/results.json (e.g. after
    `make bench-idle` finished, to include its result)."""
    RESULTS.write_text(render(Results.load()), encoding="utf-8")
    print(f"bench: wrote {RESULTS} from {VALUES}")
    return 0


def _terminated(_signum: int, _frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C: every step's `finally` stops its workers and deletes its
    # topics (the workers run in their own sessions and would outlive us otherwise).
    raise KeyboardInterrupt


USAGE = """usage: python -m bench [--render]

  (no option)  run every baseline and ratifier benchmark (under 20 min; needs the local
               services: `make up`) and write bench/RESULTS.md and bench/results.json
  --render     rewrite bench/RESULTS.md from bench/results.json (and bench/idle-result.json)
"""


def main() -> int:
    args = sys.argv[1:]
    if args == ["--render"]:
        return rerender()
    if args:
        print(USAGE, file=sys.stderr if args not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if args in (["-h"], ["--help"]) else 2
    signal.signal(signal.SIGTERM, _terminated)
    return run_all()


if __name__ == "__main__":
    raise SystemExit(main())
