"""`make bench-replies`: reply routing for a fleet (issue 15). N client processes keep M calls
in flight each (a cheap read, `get_payment`), once reading their *home partitions* of
`outcomes` (the client's default) and once reading a *reply topic* of their own (v1.3
``reply_to``), on the same pipeline in the same run. Per client: records fetched ÷ its own
outcomes; per call: the time from publishing to the outcome in the client.

    python -m bench.replies [--clients 50] [--calls 100] [--rounds 1] [--write]

``--write`` keeps the figures in bench/replies-result.json, which `python -m bench --render`
shows in bench/RESULTS.md ("Reply routing"). A client process is
``python -m bench.replies client ...`` (started by the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BenchRun, agent_token, machine_facts, percentile, table
from bench.provenance import current_run_id, not_this_run, origin, read_result, stamped
from config.settings import Settings
from ratifier_client.client import ProposedToolCall, RatifierClient
from schemas.envelopes import Outcome, Status

RESULT_FILE = Path(__file__).parent / "replies-result.json"
MODES = ("outcomes", "replies")
PARTITIONS = 12  # the deployment default (Settings.topic_partitions)
CALL_WAIT_SECONDS = 240.0


# --- one client process ---------------------------------------------------------------------


async def client_main(mode: str, calls: int, go: Path, out: Path) -> None:
    settings = Settings()
    token = agent_token(settings)
    async with RatifierClient.from_settings(settings, replies=mode == "replies") as client:
        out.with_suffix(".ready").write_text("ready")
        # Every client starts publishing at once: polling a file is the barrier.
        while not await asyncio.to_thread(go.exists):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        batch = [
            ProposedToolCall(
                tool="get_payment", arguments={"payment_id": "pay_A1001"}, context=token
            )
            for _ in range(calls)
        ]
        started = time.perf_counter()
        handles = await client.submit_many(batch)

        async def one(handle: Any) -> tuple[float, str]:
            result = await handle.result(within=CALL_WAIT_SECONDS)
            status = result.status.value if isinstance(result, Outcome) else "pending"
            return time.perf_counter() - started, status

        finished = await asyncio.gather(*(one(h) for h in handles))
        # Records still arriving for others' calls during the wait are counted too.
        out.write_text(  # noqa: ASYNC240 - once, after the measurement
            json.dumps(
                {
                    "mode": mode,
                    "fetched": client.records_fetched,
                    "own": sum(1 for _s, status in finished if status != "pending"),
                    "succeeded": sum(1 for _s, st in finished if st == Status.SUCCEEDED.value),
                    "latencies": [s for s, _status in finished],
                    "wall": max(s for s, _status in finished),
                }
            )
        )


# --- the run --------------------------------------------------------------------------------


async def _ready(run: BenchRun) -> None:
    """The pipeline answers a call end to end (consumer groups joined)."""
    deadline = time.monotonic() + 240
    async with RatifierClient.from_settings(run.settings, replies=True) as client:
        while time.monotonic() < deadline:
            result = await client.call(
                "get_payment",
                {"payment_id": "pay_A1001"},
                context=agent_token(run.settings),
                within=20,
            )
            if isinstance(result, Outcome):
                return
    raise RuntimeError("pipeline not ready in 240 s")


async def phase(run: BenchRun, mode: str, clients: int, calls: int, tag: str) -> dict[str, Any]:
    work = run.log_dir / f"{tag}-{mode}"
    work.mkdir(parents=True, exist_ok=True)
    go = work / "go"
    outs = [work / f"client{i}.json" for i in range(clients)]
    workers = [
        run.start_module(
            "bench.replies",
            f"{tag}-{mode}-client{i}",
            "client",
            "--mode",
            mode,
            "--calls",
            str(calls),
            "--go",
            str(go),
            "--out",
            str(out),
        )
        for i, out in enumerate(outs)
    ]
    deadline = time.monotonic() + 600
    while not all(o.with_suffix(".ready").exists() for o in outs):
        dead = [w for w in workers if w.process.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"clients did not start: {dead[0].log_tail() if dead else ''}")
        await asyncio.sleep(0.2)
    started = time.perf_counter()
    go.write_text("go")
    while any(w.process.poll() is None for w in workers):
        if time.perf_counter() - started > CALL_WAIT_SECONDS + 60:
            break
        await asyncio.sleep(0.2)
    for worker in workers:
        run.stop(worker)
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    latencies = [s for r in results for s in r["latencies"]]
    ratios = [r["fetched"] / max(r["own"], 1) for r in results]
    return {
        "mode": mode,
        "clients_reporting": len(results),
        "calls": sum(len(r["latencies"]) for r in results),
        "answered": sum(r["own"] for r in results),
        "succeeded": sum(r["succeeded"] for r in results),
        "ratio_max": max(ratios) if ratios else None,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "fetched_total": sum(r["fetched"] for r in results),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "wall_s": max((r["wall"] for r in results), default=float("nan")),
    }


async def bench(clients: int, calls: int, rounds: int) -> dict[str, Any]:
    run = BenchRun.create("replies", partitions=PARTITIONS)
    begun = time.perf_counter()
    try:
        await run.prepare()
        run.start("streams", "streams")
        run.start("executor", "executor")
        await _ready(run)
        phases = []
        for r in range(rounds):
            for mode in MODES:
                print(f"round {r + 1}/{rounds}: {clients} clients x {calls} calls, {mode}...")
                result = await phase(run, mode, clients, calls, f"r{r}")
                print(f"  {json.dumps(result)}")
                phases.append(result)
    finally:
        await run.close()
    return {
        "command": " ".join(["python -m bench.replies", *sys.argv[1:]]),
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "clients": clients,
        "calls_per_client": calls,
        "rounds": rounds,
        "partitions": PARTITIONS,
        "machine": machine_facts(),
        "phases": phases,
        "seconds": time.perf_counter() - begun,
    }


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def section(run_id: str | None) -> list[str]:
    """The "Reply routing" section of bench/RESULTS.md, when it was measured with run
    ``run_id`` (bench.provenance); otherwise a dash and why."""
    r = read_result(RESULT_FILE)
    why_not = not_this_run(
        r, run_id, file="bench/replies-result.json", command="make bench-replies"
    )
    if why_not is not None or r is None:
        return ["## Reply routing", "", f"— {why_not}", ""]
    rows = [
        [
            p["mode"],
            f"{p['answered']:,} / {p['calls']:,} ({p['clients_reporting']} clients)",
            _fmt(p["ratio_median"]),
            _fmt(p["ratio_max"]),
            _fmt(p["p50_ms"], 0),
            _fmt(p["p95_ms"], 0),
            _fmt(p["p99_ms"], 0),
            _fmt(p["wall_s"], 1),
            _fmt(p["calls"] / p["wall_s"], 0),
        ]
        for p in r["phases"]
    ]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for p in r["phases"]:
        by_mode.setdefault(p["mode"], []).append(p)
    added = [
        statistics.median(b["p50_ms"] for b in by_mode["replies"])
        - statistics.median(a["p50_ms"] for a in by_mode["outcomes"]),
        statistics.median(b["p95_ms"] for b in by_mode["replies"])
        - statistics.median(a["p95_ms"] for a in by_mode["outcomes"]),
    ]
    ratio = max(p["ratio_max"] or 0 for p in by_mode["replies"])
    home_ratio = statistics.median(p["ratio_median"] or 0 for p in by_mode["outcomes"])
    spread = max(
        max(p["p50_ms"] for p in phases) - min(p["p50_ms"] for p in phases)
        for phases in by_mode.values()
    )
    return [
        "## Reply routing",
        "",
        f"`{r['command']}` = `make bench-replies` ({origin(r)}; {r['seconds']:,.0f} s; "
        f"{r['machine']}). {r['clients']} client processes x {r['calls_per_client']} calls "
        f"in flight each (`get_payment`, a read: one streams worker and one executor, "
        f"{r['partitions']} partitions per topic), all publishing at once, in two modes on the "
        "same pipeline in the same run: **outcomes** (the client reads its home partition of "
        "`outcomes` and `approvals.requested`) and **replies** (each call names the client's "
        "own reply topic, v1.3 `reply_to`; the client reads only that topic). Fetched ÷ own: "
        "records a client fetched ÷ its own answered calls; latency: publishing to the "
        "outcome in the client, per call (queueing included: each client publishes its "
        "calls at once).",
        "",
        table(
            rows,
            [
                "mode",
                "answered",
                "fetched ÷ own (median)",
                "fetched ÷ own (max)",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "slowest client s",
                "calls/s",
            ],
        ),
        "",
        f"Reply routing: fetched ÷ own at most {ratio:.2f} per client (target ≤ 2); latency "
        f"added against reading `outcomes` directly: {added[0]:+,.0f} ms at p50, "
        f"{added[1]:+,.0f} ms at p95 (medians over rounds, phases in the order shown). "
        "Every call is queued behind the 5,000 published at once, so a call's latency is "
        "mostly the time the pipeline takes to drain that backlog (calls/s: one streams "
        "worker and one executor on 2 cores shared with the 50 clients and whatever else "
        "runs). Rounds of the same mode differ by up to "
        f"{spread:,.0f} ms at p50 here, of the order of the difference between the modes; "
        "what reply routing itself adds is one more record per outcome, written with it "
        "(an executor batch then writes to up to 50 more topics). The home-partition "
        "clients meanwhile fetch "
        f"{home_ratio:.1f} records (median) for each of their own.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replies")
    sub = parser.add_subparsers(dest="role")
    client = sub.add_parser("client")
    client.add_argument("--mode", choices=MODES, required=True)
    client.add_argument("--calls", type=int, required=True)
    client.add_argument("--go", type=Path, required=True)
    client.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "client":
        asyncio.run(client_main(args.mode, args.calls, args.go, args.out))
        return 0
    result = asyncio.run(bench(args.clients, args.calls, args.rounds))
    if args.write:
        RESULT_FILE.write_text(json.dumps(stamped(result), indent=2) + "\n")
    print("\n".join(section(current_run_id())) if args.write else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
