"""bench/RESULTS.md from a run's results (bench/results.json): the tables, the targets'
verdicts, the profiles and the capacity plan. Pure rendering: nothing here measures, so
`python -m bench --render` rewrites the file from saved results.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import approval_state
from bench import idle as idle_bench
from bench import replies as replies_bench
from bench.common import (
    BENCH_PAYMENTS,
    HOP_TOPICS,
    HOPS,
    table,
)

COMMAND = "make bench  (= .venv/bin/python -m bench)"
VALUES = Path(__file__).parent / "results.json"


@dataclass(frozen=True, kw_only=True)
class Results:
    """One run's results: the measured values by name, the error of each step that failed,
    how long each step took, and how long the run took."""

    values: dict[str, Any]
    errors: dict[str, str]
    timings: dict[str, float]
    total_seconds: float

    def save(self, path: Path = VALUES) -> None:
        path.write_text(json.dumps(asdict(self), indent=1, default=str), encoding="utf-8")

    @classmethod
    def load(cls, path: Path = VALUES) -> Results:
        saved = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            values=saved["values"],
            errors=saved["errors"],
            timings=saved["timings"],
            total_seconds=saved["total_seconds"],
        )


def fmt(v: Any, unit: str = "", digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    if isinstance(v, float | int):
        return f"{v:,.{digits}f}{unit}"
    return str(v)


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return float(a) / float(b)
    return None


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


def render(results: Results) -> str:
    v = results.values
    idle = _idle_result()
    lines: list[str] = ["# Benchmark results", ""]
    lines += [
        "How to read this: every figure below comes from one run of the command shown, on one "
        "machine, with the baselines (the limits of this design: raw Kafka hops, Redis and "
        "PostgreSQL round trips) measured in the same run on the same broker and envelope "
        "size. The ratios are what carries over to other machines; the absolute numbers "
        "depend on the machine and on what else runs on it (see the load average). A dash "
        "means the step failed or was skipped; its error is listed at the end. The raw values "
        "are in bench/results.json; `python -m bench --render` rewrites this file from them "
        "(`make bench-idle` does, to add its result).",
        "",
        f"Command: `{COMMAND}` — took {results.total_seconds / 60:.1f} min.",
        "",
        table(
            [tuple(row) for row in v.get("machine") or [("machine", "not recorded")]],
            ["machine", ""],
        ),
        "",
        "## Settings used (safe settings only)",
        "",
        "- Producers: `acks=all` everywhere (faust `producer_acks=-1`; executor and relays "
        "with the idempotent producer); faust producer linger 3 ms, executor 2 ms.",
        "- Executor: offsets committed after outcomes are recorded and acknowledged; "
        "consumer `isolation_level=read_committed`, `max_poll_records=200`, session timeout 6 s.",
        "- PostgreSQL: `synchronous_commit=on`, `fsync=on` (one durable commit per "
        "command's ledger transaction). Redis: default persistence of the local service.",
        f"- Topics: {12} partitions, replication factor 1 (one broker). Envelopes "
        f"{fmt(v.get('envelope_bytes'), ' B')} (get_payment with a signed context token). "
        f"Reads are spread over {BENCH_PAYMENTS} payments of the benchmark's own database "
        "`ratifier_bench` (the ledger re-reads the resource `FOR UPDATE`; one hot row would "
        "serialize every transaction).",
        "",
        "## Baselines (the limits on this machine)",
        "",
    ]
    rows = [
        [
            "B1",
            "raw aiokafka relay, one hop (getmany → send_batch, no work)",
            fmt(v.get("B1"), " rec/s"),
            fmt(v.get("B1_cpu_us"), " µs CPU/rec", 1),
        ],
        [
            "B2",
            f"raw aiokafka chain, {HOPS} hops (one process per hop)",
            fmt(v.get("B2"), " rec/s"),
            fmt(v.get("B2_cpu_us"), " µs CPU/rec", 1),
        ],
        [
            "B3",
            "faust identity agent, one hop (take_events 500, as the stages)",
            fmt(v.get("B3"), " rec/s"),
            fmt(v.get("B3_cpu_us"), " µs CPU/rec", 1),
        ],
        [
            "B2 lat",
            f"raw {HOPS}-hop chain latency at {fmt(v.get('B2_lat_rate'))} records/s (send → after the last hop)",
            f"p50 {fmt(v.get('B2_lat_p50'), ' ms', 1)}, p99 {fmt(v.get('B2_lat_p99'), ' ms', 1)}, p99.9 {fmt(v.get('B2_lat_p999'), ' ms', 1)}",
            "",
        ],
        [
            "B4",
            "redis-py asyncio `SET NX`, one round trip at a time",
            fmt(v.get("B4_plain"), " ops/s"),
            "",
        ],
        [
            "B4p",
            "redis-py asyncio `SET NX`, pipelined 100 per round trip",
            fmt(v.get("B4_pipelined"), " ops/s"),
            "",
        ],
        [
            "B5",
            "executor ledger transaction (claim, FOR UPDATE re-read, outcome, audit; commit), psycopg, one at a time",
            fmt(v.get("B5_plain"), " tx/s"),
            "",
        ],
        [
            "B5p",
            "same, pipeline mode (50 in flight, each its own commit)",
            fmt(v.get("B5_pipelined"), " tx/s"),
            "",
        ],
        [
            "B5g",
            "same, 50 commands' ledger work per transaction (one commit)",
            fmt(v.get("B5_grouped"), " cmd/s"),
            "",
        ],
    ]
    lines += [table(rows, ["id", "baseline", "measured", "CPU"]), ""]
    lines += ["## ratifier", ""]
    e2e_cpu = (v.get("e2e_cpu_streams_us") or 0) + (v.get("e2e_cpu_executors_us") or 0)
    stage_rows = []
    for stage in ("validator", "authorizer", "approval-join", "executor"):
        stage_rows.append(
            [
                f"{stage} stage alone (backlog drain, one worker)",
                fmt(v.get(f"stage_{stage}"), " calls/s"),
                fmt(v.get(f"stage_{stage}_cpu_us"), " µs CPU/call"),
            ]
        )
    rows = [
        [
            "read calls end to end, closed loop (1 streams worker, 2 executors; window "
            f"{fmt(v.get('e2e_window'))} in flight)",
            fmt(v.get("e2e_reads"), " calls/s"),
            f"{fmt(e2e_cpu, ' µs CPU/call')} (streams {fmt(v.get('e2e_cpu_streams_us'))}, executors {fmt(v.get('e2e_cpu_executors_us'))})",
        ],
        [
            f"latency, open loop at {fmt(v.get('lat_rate'), ' calls/s')} (50 %), proposed_at → outcome `at`, {fmt(v.get('lat_samples'))} calls",
            f"p50 {fmt(v.get('lat_p50'), ' ms', 1)}, p99 {fmt(v.get('lat_p99'), ' ms', 1)}, p99.9 {fmt(v.get('lat_p999'), ' ms', 1)}",
            "",
        ],
        [
            "where the latency goes (p50 / p99 between the broker append times of a call's "
            "records): proposed → validated (validator), → authorized (authorizer), → "
            "committed (approval-join), → outcome (executor)",
            " / ".join(
                f"{fmt(v.get(f'hop_{t.value}_p50_ms'), ' ms')} / {fmt(v.get(f'hop_{t.value}_p99_ms'), ' ms')}"
                for t in HOP_TOPICS[1:]
            ),
            "",
        ],
        [
            "approved writes (propose_refund, bot approver, provider), closed loop 200",
            fmt(v.get("writes"), " calls/s", 1),
            f"p50 {fmt(v.get('writes_p50'), ' ms')}; {v.get('writes_statuses', '—')}",
        ],
        *stage_rows,
        [
            "T3: executor alone, fresh read commands (mean of 2 drains), Redis claim off "
            "(`RATIFIER_EXECUTOR__REDIS_FAST_PATH=false`, the ledger alone dedups)",
            fmt(v.get("executor_nodedup"), " commands/s"),
            fmt(v.get("executor_nodedup_cpu_us"), " µs CPU/call"),
        ],
        [
            "T3: same, Redis claim on (the default); drains in A-B-B-A order: "
            + ", ".join(f"{x:,.0f}" for x in v.get("executor_drains", []))
            + " commands/s",
            fmt(v.get("executor_dedup"), " commands/s"),
            fmt(v.get("executor_dedup_cpu_us"), " µs CPU/call"),
        ],
        ["pure validate (`on_proposed`)", fmt(v.get("pure_validate_us"), " µs/call", 1), ""],
        ["pure context-token verify", fmt(v.get("pure_verify_us"), " µs/call", 1), ""],
        [
            "pure authorize (Cedar, batches of 200; single: "
            f"{fmt(v.get('pure_authorize_single_us'), ' µs', 0)})",
            fmt(v.get("pure_authorize_us"), " µs/call", 1),
            "",
        ],
    ]
    lines += [table(rows, ["what", "measured", "CPU / note"]), ""]

    # Ratios and targets.
    t1 = ratio(v.get("B3"), v.get("B1"))
    t2 = ratio(v.get("e2e_reads"), v.get("B2"))
    t3 = ratio(v.get("executor_dedup"), v.get("executor_nodedup"))
    pure_vc = sum(
        v.get(k) or 0 for k in ("pure_validate_us", "pure_verify_us", "pure_authorize_us")
    )
    t7 = ratio(pure_vc, e2e_cpu) if e2e_cpu else None
    first_short = v.get("t5_short_first_ms")
    first_real = (idle.get("first") or {}).get("outcome_ms") if idle else None
    lat = (v.get("lat_p50"), v.get("lat_p99"), v.get("lat_p999"))
    lat_ok = None
    if lat[0] is not None and lat[1] is not None and lat[2] is not None:
        lat_ok = lat[0] <= 15 and lat[1] <= 50 and lat[2] <= 250
    t6_ok = None
    if "t6_recovered_s" in v:
        t6_ok = (
            v["t6_recovered_s"] is not None
            and v["t6_recovered_s"] <= 30
            and v.get("t6_dup_ledger") == 0
            and v.get("t6_dup_audit") == 0
        )
    t2_ok = None if t2 is None else (t2 >= 0.35 and (v.get("e2e_reads") or 0) >= 2000)
    targets = [
        [
            "T1",
            "faust hop ≥ 50 % of B1",
            f"B3/B1 = {fmt(v.get('B3'))}/{fmt(v.get('B1'))} = {fmt(t1 and t1 * 100, ' %')}",
            verdict(None if t1 is None else t1 >= 0.5),
        ],
        [
            "T2",
            "end-to-end reads ≥ 35 % of B2 and ≥ 2,000 calls/s",
            f"{fmt(v.get('e2e_reads'), ' calls/s')} = {fmt(t2 and t2 * 100, ' %')} of B2 ({fmt(v.get('B2'))})",
            verdict(t2_ok),
        ],
        [
            "T3",
            "executor with dedup ≥ 80 % of without",
            f"{fmt(v.get('executor_dedup'))} / {fmt(v.get('executor_nodedup'))} commands/s = {fmt(t3 and t3 * 100, ' %')}",
            verdict(None if t3 is None else t3 >= 0.8),
        ],
        [
            "T4",
            "at 50 % load p50 ≤ 15 ms, p99 ≤ 50 ms, p99.9 ≤ 250 ms",
            f"p50 {fmt(lat[0], ' ms', 1)}, p99 {fmt(lat[1], ' ms', 1)}, p99.9 {fmt(lat[2], ' ms', 1)} at {fmt(v.get('lat_rate'), ' calls/s')}",
            verdict(lat_ok),
        ],
        [
            "T5 (short)",
            "first call after idle ≤ 100 ms",
            f"{fmt(first_short, ' ms')} (second call {fmt(v.get('t5_short_second_ms'), ' ms')}); {v.get('t5_short_note', '')}",
            verdict(None if first_short is None else first_short <= 100),
        ],
        [
            "T5 (30 min)",
            "first call after 30 min idle ≤ 100 ms",
            (
                f"{fmt(first_real, ' ms')} (warm p50 {fmt(idle.get('warm_p50_ms'), ' ms')}); `{idle.get('command')}` finished {idle.get('finished')}"
                if idle
                else "no result yet: run `make bench-idle`"
            ),
            verdict(None if first_real is None else first_real <= 100),
        ],
        [
            "T6",
            "kill one executor under load: recovered ≤ 30 s, 0 duplicate effects",
            f"recovered after {fmt(v.get('t6_recovered_s'), ' s')} (≥ 90 % of {fmt(v.get('t6_pre_rate'), ' calls/s')}); "
            f"duplicate ledger entries {fmt(v.get('t6_dup_ledger'))}, duplicate executed-audit rows {fmt(v.get('t6_dup_audit'))}; "
            f"{fmt(v.get('t6_finished'))}/{fmt(v.get('t6_calls'))} calls ended",
            verdict(t6_ok),
        ],
        [
            "T7",
            "validation + authorization CPU ≤ 15 % of per-call total",
            f"({fmt(v.get('pure_validate_us'), '', 1)} + {fmt(v.get('pure_verify_us'), '', 1)} + {fmt(v.get('pure_authorize_us'), '', 1)}) µs / {fmt(e2e_cpu, ' µs')} = {fmt(t7 and t7 * 100, ' %', 1)}",
            verdict(None if t7 is None else t7 <= 0.15),
        ],
    ]
    lines += ["## Targets", "", table(targets, ["target", "wanted", "measured", "verdict"]), ""]
    lines += [
        "T5 variants: *short* runs inside `make bench`: after 30 s idle every TCP connection of "
        "the workers (Kafka, PostgreSQL, Redis) is closed by the kernel (`ss -K`), which is the "
        "state a long idle leaves behind (broker `connections.max.idle.ms` 10 min, client "
        "`connections_max_idle_ms` 9 min, NAT/firewall idle timers). *30 min* is "
        "`make bench-idle` (bench/idle-result.json), a real 30-minute idle without any forcing.",
        "",
        "T6 detail: outcomes per second around the kill (second 0 = SIGKILL), from the outcome "
        f"timestamps: {v.get('t6_buckets', '—')} (from −5 s). Repeated terminal outcome "
        f"records (redelivery answered from the ledger, not a second effect): {fmt(v.get('t6_repeated_outcomes'))}.",
        "",
    ]
    lines += _cpu_budget(v, e2e_cpu)
    lines += _profile_section(v)
    lines += _approval_state_section()
    lines += replies_bench.section()
    lines += _capacity_section(v)
    if results.errors:
        lines += ["## Failed or skipped steps", ""]
        lines += [f"- {k}: `{e}`" for k, e in results.errors.items()]
        lines += [""]
    lines += [
        "## Step durations",
        "",
        table([[k, f"{s:.0f} s"] for k, s in results.timings.items()], ["step", "took"]),
        "",
    ]
    return "\n".join(lines)


def _approval_state_section() -> list[str]:
    """The approval-join's bounded state (`make bench-approvals`), when it was measured."""
    try:
        r = dict(json.loads(approval_state.RESULT_FILE.read_text()))
    except (OSError, ValueError):
        return []
    mb = 1024 * 1024
    return [
        "## Approval-join state",
        "",
        f"`{r['command']}` ({r['finished']}; the join's pure state machine with signed "
        "decisions on a simulated clock, no brokers): terminal states are deleted with a "
        f"tombstone {r['retention_s']:,.0f} s after their request (TTL + clock skew + "
        "retention margin), so the table and the compacted changelog's live records stay at "
        "rate × retention whatever the total.",
        "",
        table(
            [
                ["approvals", f"{r['approvals']:,.0f} at {r['rate_per_s']:,.0f}/s"],
                [
                    "table at the end",
                    f"{r['table_entries_end']:,.0f} states, {r['table_bytes_end'] / mb:,.0f} MB "
                    f"({r['bytes_per_state']:,.0f} bytes each)",
                ],
                [
                    "table at its peak",
                    f"{r['table_entries_peak']:,.0f} states, {r['table_bytes_peak'] / mb:,.0f} MB",
                ],
                [
                    "changelog written (before compaction)",
                    f"{r['changelog_values_written']:,.0f} values, "
                    f"{r['changelog_bytes_written'] / mb:,.0f} MB, "
                    f"{r['changelog_tombstones']:,.0f} tombstones",
                ],
                ["run time", f"{r['seconds']:,.0f} s"],
            ],
            ["measure", "value"],
        ),
        "",
    ]


def _idle_result() -> dict[str, Any]:
    try:
        return dict(json.loads(idle_bench.RESULT_FILE.read_text()))
    except (OSError, ValueError):
        return {}


def _profile_section(v: dict[str, Any]) -> list[str]:
    lines = ["## Profile and floors", ""]
    for name in ("profile_streams", "profile_executor0"):
        found = v.get(name)
        if found:
            who = name.removeprefix("profile_")
            lines += [
                f"py-spy on the {who} process under closed-loop load, share of busy samples "
                "by library (innermost frame) and the functions with the most own time:",
                "",
                table(
                    [[k, f"{s:.0%}"] for k, s in found.get("categories", [])], ["library", "share"]
                ),
                "",
                table(
                    [[f"`{k}`", f"{s:.0%}"] for k, s in found.get("own", [])], ["function", "own"]
                ),
                "",
            ]
    lines += [FLOORS, ""]
    return lines


FLOORS = (
    (Path(__file__).parent / "FLOORS.md").read_text(encoding="utf-8")
    if (Path(__file__).parent / "FLOORS.md").exists()
    else ""
)


def _cpu_budget(v: dict[str, Any], e2e_cpu: float) -> list[str]:
    """T2 against the machine's CPU: what the measured CPU per call allows on these cores."""
    cores = os.cpu_count() or 1
    rate = v.get("e2e_reads")
    if not e2e_cpu or not rate:
        return []
    ceiling = cores * 1_000_000 / e2e_cpu
    budget = cores * 1_000_000 / 2000
    return [
        f"CPU budget (T2): the closed loop spent {fmt(e2e_cpu, ' µs')} of ratifier process CPU "
        f"per call (streams {fmt(v.get('e2e_cpu_streams_us'))}, executors "
        f"{fmt(v.get('e2e_cpu_executors_us'))}). This machine's {cores} cores give "
        f"{cores * 1_000_000:,} µs of CPU per second, so ratifier's processes alone could not "
        f"pass {fmt(ceiling, ' calls/s')} even with every core busy on them, before the "
        f"broker's, PostgreSQL's, Redis's and the load generator's own CPU; measured "
        f"{fmt(rate, ' calls/s')} ({fmt(rate / ceiling * 100, ' %')} of that ceiling). The "
        f"end-to-end rate is CPU-bound: T2's 2,000 calls/s on these cores needs at most "
        f"{fmt(budget, ' µs')} of CPU per call for everything, broker included. B2's "
        f"{fmt(v.get('B2_cpu_us'), ' µs', 1)} per record for four raw hops shows the transport "
        f"fits in that; faust's {fmt(v.get('B3_cpu_us'), ' µs', 1)} per hop (three hops) and "
        f"the executor's ledger transaction "
        f"({fmt(v.get('executor_dedup_cpu_us'), ' µs')} per command alone) do not.",
        "",
    ]


# What each stage pod requests (deploy/k8s/base): one worker at 60 % of one core; memory is
# the manifests' figure, not a measured one.
POD_CPU_MILLI = 600
POD_MEMORY_MI = 256


def _requests(workers: int) -> str:
    cpu = workers * POD_CPU_MILLI / 1000
    memory = workers * POD_MEMORY_MI / 1024
    return f"{workers} × ({POD_CPU_MILLI}m, {POD_MEMORY_MI} Mi) = {cpu:,.1f} CPU, {memory:,.2f} GiB"


def _capacity_section(v: dict[str, Any]) -> list[str]:
    stages = {
        s: v.get(f"stage_{s}_cpu_us")
        for s in ("validator", "authorizer", "approval-join", "executor")
    }
    lines = ["## Capacity plan", ""]
    if not all(isinstance(x, int | float) for x in stages.values()):
        return [*lines, "Not computed: a stage measurement is missing.", ""]
    rows = []
    resources = []
    partitions: dict[int, int] = {}
    for target in (10_000, 100_000):
        row = [f"{target:,} calls/s"]
        requested = [f"{target:,} calls/s"]
        most = 1
        total_workers = 0
        for us in stages.values():
            cores = target * float(us or 0) / 1e6
            # One worker process is one core (asyncio, one thread); plan at 60 % busy.
            workers = max(1, math.ceil(cores / 0.6))
            most = max(most, workers)
            total_workers += workers
            row.append(f"{cores:,.1f} cores → {workers} workers")
            requested.append(_requests(workers))
        rows.append(row)
        requested.append(f"{total_workers} pods: {_requests(total_workers)}")
        resources.append(requested)
        # Room to double the largest group without repartitioning.
        partitions[target] = 2 ** math.ceil(math.log2(most * 2))
    lines += [
        "CPU per call per stage measured above (each stage alone draining a backlog, process "
        "CPU time / calls, on this machine's cores): "
        + ", ".join(f"{s} {float(us or 0):,.0f} µs" for s, us in stages.items())
        + ". Workers = cores at 60 % busy; a server core is typically 2–3× faster than "
        "these shared virtual cores, which divides the counts accordingly.",
        "",
        table(rows, ["load", *stages.keys()]),
        "",
        f"Resources (requests of the stage Deployments in deploy/k8s/base: {POD_CPU_MILLI}m CPU "
        f"— one worker at 60 % of the one core it may use, its limit — and {POD_MEMORY_MI} Mi "
        f"memory, limit {2 * POD_MEMORY_MI} Mi; memory was not measured by this benchmark: "
        "revise it from `process_resident_memory_bytes` under load):",
        "",
        table(resources, ["load", *stages.keys(), "total"]),
        "",
    ]
    b5 = v.get("B5_grouped") or v.get("B5_plain")
    lines += [
        "- Partitions: a worker process is one core and a partition has one consumer, so every "
        "topic needs at least the largest worker count above, doubled for headroom: "
        f"10k calls/s → {partitions[10_000]} partitions, 100k → {partitions[100_000]} "
        "(beyond a few thousand partitions per cluster, split tenants over several "
        "prefixes or clusters).",
        f"- PostgreSQL: one ledger transaction per command costs one durable commit; the "
        f"single-connection figures here are {fmt(v.get('B5_plain'))} tx/s plain, "
        f"{fmt(v.get('B5_pipelined'))} tx/s pipelined and {fmt(b5)} commands/s grouped 50 per "
        "commit. Group commit across connections makes commits/s a WAL-flush budget, not a "
        "per-connection one: 10k commands/s needs ~10k commits/s (or ~200/s grouped by 50) — "
        "one primary on NVMe with `commit_delay` tuned; 100k/s needs grouping per batch and "
        "sharding the ledger by tenant (e.g. 4–8 primaries) — the ledger table's unique index "
        "and the audit inserts then dominate, so size for ~3 row inserts + 1 row lock per command.",
        f"- Redis: one claim (Lua) + one finish per command; at {fmt(v.get('B4_plain'))} "
        f"sequential and {fmt(v.get('B4_pipelined'))} pipelined ops/s per client here, 10k "
        "commands/s = 20k ops/s fits one Redis instance; 100k/s = 200k ops/s needs the claims "
        "pipelined per batch and a Redis Cluster of ~3–4 primaries (keys are per operation, "
        "so they shard evenly).",
        "",
    ]
    return lines
