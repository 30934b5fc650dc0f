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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.admission import admission_costs
from bench.common import RESULTS, BenchRun
from bench.flood import noisy_neighbour
from bench.measure import (
    FULL,
    QUICK,
    Measurements,
    Plan,
    baseline_postgres,
    baseline_redis,
    baselines_kafka,
    chain_latency,
    executor_with_and_without_dedup,
    kill_one,
    latency_settings,
    open_loop,
    pure_costs,
    read_chain_latency,
    seed_payments,
    stages_alone,
    start_pipeline,
    whole_pipeline,
)
from bench.report import COMMAND, VALUES, Results, render, t6_correct, t6_verdict, verdict
from ratifier.migrate import migrate


async def measure(plan: Plan) -> Results:
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    run = Measurements(budget_seconds=plan.budget_seconds)
    n = int(os.environ.get("BENCH_N", str(plan.n)))
    stage_n = int(os.environ.get("BENCH_STAGE_N", str(plan.stage_n)))
    print(
        f"bench: {COMMAND}{' --quick' if plan.quick else ''}; run {run.run_id}; budget "
        f"{plan.budget_seconds / 60:.0f} min; logs under test-artifacts/bench-logs",
        flush=True,
    )
    run.values["plan"] = asdict(plan)
    run.values["latency_settings"] = await latency_settings()
    url = BenchRun.create("setup").settings.storage.database_url
    await asyncio.to_thread(migrate, url)
    await asyncio.to_thread(seed_payments, url)
    await run.step("pure stage costs", 120, lambda: pure_costs(plan.pure_n))
    await run.step(
        "B1 relay, B2 chain, T1 loop identity hop (+ its profile)",
        420,
        lambda: baselines_kafka(n),
    )
    await run.step(
        "B2 latency floor (raw 4-hop chain, 50 records/s)",
        120,
        lambda: chain_latency(50, plan.chain_latency_seconds),
    )
    b2r = float(run.values.get("B2r") or 100.0)
    await run.step(
        "B2r latency (read chain: 3 hops, the last GETting from the provider; 50 records/s "
        "and half its capacity)",
        180,
        lambda: read_chain_latency({"50": 50.0, "half": b2r / 2}, plan.chain_latency_seconds),
    )
    await run.step("B4 Redis SET NX", 60, lambda: baseline_redis(plan.redis_n))
    await run.step(
        "B5 ledger transaction (psycopg)", 120, lambda: baseline_postgres(plan.postgres_n)
    )
    await run.step(
        "stages alone (validator, authorizer, approval-join, executor)",
        300,
        lambda: stages_alone(stage_n),
    )
    await run.step(
        "T3 executor without/with dedup (3 + 3 drains interleaved, + 1 under py-spy)",
        540,
        lambda: executor_with_and_without_dedup(plan.executor_n),
    )
    await run.step(
        "admission: CPU per call admitted / refused (validator + Redis)",
        120,
        lambda: admission_costs(2_000 if plan.quick else 10_000),
    )
    await run.step(
        f"noisy neighbour: tenant A's flood of {plan.flood:,} reads vs B "
        "(tests/e2e/test_admission.py, its own pipeline)",
        240,
        lambda: noisy_neighbour(plan.flood, plan.flood_strict, run.run_id),
    )
    try:
        await asyncio.wait_for(whole_pipeline(run, plan), timeout=max(run.left() - 10, 30))
    except Exception as exc:
        run.errors["whole pipeline"] = f"{type(exc).__name__}: {exc}"[:300]
    return run.results()


# A quick run's results and report go here, never over the committed ones.
QUICK_DIR = Path("test-artifacts") / "bench-quick"


def run_all(plan: Plan) -> int:
    results = asyncio.run(measure(plan))
    values, report = (
        (QUICK_DIR / "results.json", QUICK_DIR / "RESULTS.md") if plan.quick else (VALUES, RESULTS)
    )
    values.parent.mkdir(parents=True, exist_ok=True)
    results.save(values)
    report.write_text(render(results), encoding="utf-8")
    print(
        f"bench: wrote {report} in {results.total_seconds / 60:.1f} min; "
        f"{len(results.errors)} step(s) failed",
        flush=True,
    )
    return 0 if not results.errors else 1


async def measure_t6(plan: Plan) -> Results:
    """T6 alone on a fresh pipeline (the quick plan's sizes): what `make mutants` runs to
    show that T6 fails when an effect can be applied twice."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    run = Measurements(budget_seconds=plan.budget_seconds)
    url = BenchRun.create("setup").settings.storage.database_url
    await asyncio.to_thread(migrate, url)
    await asyncio.to_thread(seed_payments, url)
    bench = BenchRun.create("t6")
    try:

        async def t6() -> dict[str, Any]:
            pipe = await start_pipeline(bench, executors=2)
            try:
                # Warm, as the pipeline of `make bench` is by T6: a fresh one answers its
                # first seconds of load late, and the rate before the kill would be theirs.
                warm = await open_loop(pipe, 200, 5, tag=f"warm-{run.run_id}")
                await pipe.watcher.wait(warm, timeout=60)
                return await kill_one(
                    pipe, 200, plan.kill_seconds, plan.kill_at, write_rate=plan.kill_write_rate
                )
            finally:
                await pipe.proposer.stop()
                await pipe.watcher.stop()

        await run.step("T6 alone (pipeline start, one executor killed)", 400, t6)
    finally:
        await bench.close()
    return run.results()


def t6_alone() -> int:
    """`python -m bench --t6`: prints T6's row; exit 1 when something was done or answered
    twice, a call never settled or an effect went unreported (the recovery time is printed,
    not judged: on a fresh pipeline of a machine other work shares it is that work's)."""
    # The quick plan's rates, with 7 s of load before the kill to measure the rate on.
    results = asyncio.run(measure_t6(replace(QUICK, kill_seconds=25, kill_at=10)))
    ok, measured = t6_verdict(results.values)
    correct = t6_correct(results.values)
    print(f"T6: {verdict(ok)}: {measured}", flush=True)
    for step, error in results.errors.items():
        print(f"T6: {step} failed: {error}", flush=True)
    print(
        "T6 without its recovery time (the exit code): "
        + ("nothing twice, every call settled, every effect reported" if correct else "FAILED"),
        flush=True,
    )
    return 0 if correct else 1


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


USAGE = """usage: python -m bench [--quick | --render]

  (no option)  run every baseline and ratifier benchmark (under 20 min; needs the local
               services: `make up`) and write bench/RESULTS.md and bench/results.json
  --quick      every step with tiny sizes and durations (a few minutes; also BENCH_QUICK=1):
               checks that the whole run and its report work; writes
               test-artifacts/bench-quick/RESULTS.md and results.json, not the committed ones
  --render     rewrite bench/RESULTS.md from bench/results.json (and the separate runs'
               result files stamped with its run id)
  --t6         T6 alone on a fresh pipeline (~1 min): prints its row; exit 1 when something
               was done or answered twice, a call never settled or an effect went unreported
"""


def main() -> int:
    args = sys.argv[1:]
    if args == ["--render"]:
        return rerender()
    if args == ["--t6"]:
        signal.signal(signal.SIGTERM, _terminated)
        return t6_alone()
    quick = args == ["--quick"] or (not args and os.environ.get("BENCH_QUICK") == "1")
    if args and not quick:
        print(USAGE, file=sys.stderr if args not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if args in (["-h"], ["--help"]) else 2
    signal.signal(signal.SIGTERM, _terminated)
    return run_all(QUICK if quick else FULL)


if __name__ == "__main__":
    raise SystemExit(main())
