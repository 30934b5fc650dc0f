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

from bench import approval_state, provenance
from bench import contended as contended_bench
from bench import idle as idle_bench
from bench import operator_commands as operator_bench
from bench import replies as replies_bench
from bench.common import (
    BENCH_PAYMENTS,
    HOP_TOPICS,
    HOPS,
    is_executor,
    table,
)
from bench.provenance import not_this_run, origin, read_result

COMMAND = "make bench  (= .venv/bin/python -m bench)"
VALUES = provenance.VALUES


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


# The issue's targets (issue 29; rows marked issue 16 are kept from it) with the figures of
# the run it was filed from ("today": a6dc734, an Intel Xeon of 2 cores).
ISSUE = "issue 29"
RSS_LIMIT_MB = 250
RSS_STABLE_GROWTH = 0.10


@dataclass(frozen=True, kw_only=True)
class Target:
    """One row of the target table, and what to show when it is not met."""

    name: str
    today: str
    wanted: str
    baseline: str
    measured: str
    ok: bool | None
    # Why it stops where it does: numbers of this run, then the profile that shows it.
    floor: str
    profile: str | None = None  # a key of `profiles(v)`, when a profile shows the floor


def _pct(x: float | None) -> str:
    return fmt(x * 100 if x is not None else None, " %")


def _cpu_of(v: dict[str, Any]) -> float | None:
    """CPU per read call of every ratifier process in the closed loop."""
    total = v.get("e2e_cpu_us")
    if isinstance(total, int | float):
        return float(total)
    parts = [v.get("e2e_cpu_streams_us"), v.get("e2e_cpu_executors_us")]
    if all(isinstance(x, int | float) for x in parts):
        return float(sum(parts))  # type: ignore[arg-type]  # checked above
    return None


def _by_process(cpu: Any) -> str:
    if not isinstance(cpu, dict) or not cpu:
        return ""
    return ", ".join(f"{name} {fmt(us)}" for name, us in sorted(cpu.items(), key=lambda kv: -kv[1]))


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _cpu_parts(v: dict[str, Any]) -> str:
    """CPU per call by process (by side, from a run that did not record processes)."""
    return _by_process(v.get("e2e_cpu_by_process")) or (
        f"streams {fmt(v.get('e2e_cpu_streams_us'))}, "
        f"executors {fmt(v.get('e2e_cpu_executors_us'))}"
    )


def _rss_verdict(rss: Any) -> tuple[bool | None, str, str]:
    """(ok, measured text, floor text) of the RSS target."""
    if not isinstance(rss, dict) or not rss:
        return None, "—", "not measured"
    largest = max(rss, key=lambda name: rss[name].get("max_mb") or 0)
    growths: dict[str, float] = {
        n: float(r["growth"]) for n, r in rss.items() if r.get("growth") is not None
    }
    steepest = max(growths, key=lambda n: growths[n]) if growths else None
    too_big = [n for n, r in rss.items() if (r.get("max_mb") or 0) > RSS_LIMIT_MB]
    growing = [n for n, g in growths.items() if g >= RSS_STABLE_GROWTH]
    ok = not too_big and not growing and len(growths) == len(rss)
    measured = (
        f"max {fmt(rss[largest].get('max_mb'), ' MB')} ({largest}); largest growth "
        + (f"{_pct(growths[steepest])} ({steepest})" if steepest else "—")
        + f"; {len(rss)} processes"
    )
    floor = (
        f"over {RSS_LIMIT_MB} MB: {', '.join(too_big) or 'none'}; growing ≥ "
        f"{RSS_STABLE_GROWTH:.0%}: {', '.join(growing) or 'none'}. Next step: compare "
        "`tracemalloc` snapshots of "
        f"{(growing or too_big or [largest])[0]} taken after the first minute and at the end "
        "of the same load (`PYTHONTRACEMALLOC=25`, `tracemalloc.take_snapshot().compare_to`) "
        "to name what grows, then bound it (a size limit or an expiry)."
    )
    return ok, measured, floor


def _busiest(cpu: Any, profiled: dict[str, Any], executor: bool | None) -> str | None:
    """The profiled process of a kind (executor or not; None: any) that spent the most CPU."""
    names = [n for n in profiled if executor is None or is_executor(n) == executor]
    if not names:
        return None
    spent = cpu if isinstance(cpu, dict) else {}
    return max(names, key=lambda n: spent.get(n) or 0.0)


def profiles(v: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The profiles that show the floors, by key: (what was profiled, py-spy summary)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    if v.get("profile_t1_loop"):
        found["loop"] = (
            "the T1 loop identity hop process, draining a backlog",
            v["profile_t1_loop"],
        )
    # A run from before profile_reads kept the streams worker's and one executor's.
    reads = v.get("profile_reads") or {
        name.removeprefix("profile_"): v[name]
        for name in ("profile_streams", "profile_executor0")
        if v.get(name)
    }
    cpu = v.get("profile_reads_cpu_by_process") or v.get("e2e_cpu_by_process")
    for key, executor in (("reads-streams", False), ("reads-executor", True)):
        name = _busiest(cpu, reads, executor)
        if name is not None and reads.get(name):
            found[key] = (
                f"{name} (the busiest {'executor' if executor else 'stream'} process) under "
                "closed-loop read load",
                reads[name],
            )
    if v.get("profile_t3_dedup"):
        found["t3"] = ("one executor draining write commands with dedup", v["profile_t3_dedup"])
    writes = v.get("profile_writes") or {}
    name = _busiest(
        v.get("profile_writes_cpu_by_process") or v.get("writes_cpu_by_process"), writes, None
    )
    if name is not None and writes.get(name):
        found["writes"] = (f"{name} (the busiest process) under approved-write load", writes[name])
    auto = v.get("profile_auto_writes") or {}
    name = _busiest(v.get("auto_writes_cpu_by_process"), auto, None)
    if name is not None and auto.get(name):
        found["auto_writes"] = (
            f"{name} (the busiest process) under auto-approved write load",
            auto[name],
        )
    return found


# What would move a floor, by the library the samples are in.
NEXT_STEP = {
    "asyncio event loop": "fewer event-loop turns and socket writes per record: one future per "
    "partition batch (`send_batch`) instead of one `send` per record, fewer tasks per record",
    "aiokafka": "publish per partition batch (`create_batch` → `send_batch`, as the B1 relay "
    "does) instead of one `send` per record",
    "faust + mode": "take the remaining stage off faust's per-event path (the runtime loop with "
    "a changelog topic of its own)",
    "psycopg": "fewer round trips per command: a write's ledger insert, outcome and audit row "
    "as one statement (the resources of a batch's calls are one query per tenant and tool in "
    "the authorizer and in the executor, a batch's read audit rows one statement, writes "
    "group-committed)",
    "pydantic": "parse each envelope once per hop (`model_validate_json` on the bytes) and "
    "serialize once; no re-validation of records the stage built itself",
    "redis-py": "fewer scripts per write: the claims and finishes of a batch already take one "
    "round trip each; leave the finish out where the ledger answers a repeat as fast",
    "token (PyJWT, cryptography)": "verify each signature once: context tokens are cached per "
    "token already; cache verified approval receipts (the executor's EdDSA verify) by digest "
    "until their expiry",
    "Cedar": "Cedar's own metrics put a request's build at about 45 us and its evaluation at "
    "about 12: reuse the decision of identical requests (principal, action, resource, context "
    "and entities alike) within a batch and, bounded, across batches of one policy version "
    "(uids are structured and policies and schema parsed once already)",
    "json": "serialize each record once (pydantic's `model_dump_json`, no `json` round trip)",
    "ratifier runtime loop": "make the loop's per-record work per batch in runtime/loop.py "
    "(hop metric and span, publication bookkeeping)",
    "telemetry (OpenTelemetry, prometheus_client)": "record metrics and spans per batch, not "
    "per record",
    "ratifier code": "the top function above is ratifier's own: make it per batch",
}


def floor_line(frames: dict[str, Any], who: str) -> str:
    """One line: where the profiled process spends its samples, and the next step."""
    categories = [
        (c, s)
        for c, s in frames.get("categories", [])
        if c not in ("other", "bench harness", "waiting in epoll (not CPU)")
    ]
    if not categories:
        return f"No profile of {who} was recorded (py-spy missing, or the step failed)."
    top, share = categories[0]
    then = ", ".join(f"{c} {s:.0%}" for c, s in categories[1:3])
    own = [f for f in frames.get("own") or [] if "(selectors.py)" not in f[0]]
    function = f"; top own-time function `{own[0][0]}` ({own[0][1]:.0%})" if own else ""
    step = NEXT_STEP.get(top, "see the top functions")
    return (
        f"Floor: {who} spends {share:.0%} of its busy samples in {top}"
        f"{f' (then {then})' if then else ''}{function}. Next step: {step}."
    )


def _profile_tables(frames: dict[str, Any]) -> list[str]:
    samples = dict((k, c) for k, c in frames.get("samples") or [])
    return [
        f"{fmt(samples.get('busy samples'))} busy samples at "
        f"{fmt(samples.get('rate per second'))}/s (py-spy; library by the innermost frame):",
        "",
        table([[k, f"{s:.0%}"] for k, s in frames.get("categories", [])[:8]], ["library", "share"]),
        "",
        table([[f"`{k}`", f"{s:.0%}"] for k, s in frames.get("own", [])[:8]], ["function", "own"]),
        "",
    ]


def _times(a: Any, b: Any) -> str:
    r = ratio(a, b)
    return "—" if r is None else f"{r:.1f}×"


def _write_hops(v: dict[str, Any], key: str) -> str:
    """Where a closed-loop write's time goes: p50 / p99 of each hop (broker append times);
    → committed is the approval-join's hop (the receipt, or the human's decision)."""
    hops = [
        (t.value, v.get(f"{key}_hop_{t.value}_p50_ms"), v.get(f"{key}_hop_{t.value}_p99_ms"))
        for t in HOP_TOPICS[1:]
    ]
    measured = {t: float(p50) for t, p50, _ in hops if isinstance(p50, int | float)}
    if not measured:
        return ""
    slowest = max(measured, key=measured.__getitem__)
    who = HOP_STAGES.get(slowest, slowest)
    return (
        "Per-hop p50 / p99 (broker append times): "
        + ", ".join(f"→ {t} {fmt(p50, '')} / {fmt(p99, ' ms')}" for t, p50, p99 in hops)
        + f"; the slowest hop is → {slowest}, the {who}'s."
    )


# The stage that publishes to each topic a call's records go through (the topic's hop).
HOP_STAGES = {
    "calls.validated": "validator",
    "calls.authorized": "authorizer",
    "commands.committed": "approval-join",
    "outcomes": "executor",
}


def _writes_target(
    v: dict[str, Any], key: str, *, name: str, today: str, share: float, what: str
) -> Target:
    """A closed-loop write row (``key``: its values' prefix; also its profile's key): at
    least ``share`` of B5g."""
    got = ratio(v.get(key), v.get("B5_grouped"))
    return Target(
        name=name,
        today=today,
        wanted=f"≥ {share:.0%} of B5g".replace("%", " %"),
        baseline=f"B5g {fmt(v.get('B5_grouped'), ' cmd/s')}",
        measured=f"{fmt(v.get(key), ' calls/s', 1)} = {_pct(got)}",
        ok=None if got is None else got >= share,
        floor=f"p50 {fmt(v.get(f'{key}_p50'), ' ms')} per {what}; CPU per write by process: "
        f"{_by_process(v.get(f'{key}_cpu_by_process')) or '—'} µs. " + _write_hops(v, key),
        profile=key,
    )


def _join_hop_target(v: dict[str, Any]) -> Target:
    """The approval-join's own hops (issue 44): a request (→ approvals.requested) and a
    decision (approvals.decided → commands.committed), p50 ≤ 50 ms and p99 ≤ 200 ms, at half
    the auto-approved writes' rate (which the authorizer commits without the join)."""
    hops = [
        v.get(f"join_{which}_{q}_ms") for which in ("request", "decision") for q in ("p50", "p99")
    ]
    known = [h for h in hops if isinstance(h, int | float) and h == h]
    ok = None
    if len(known) == len(hops):
        request_p50, request_p99, decision_p50, decision_p99 = known
        ok = max(request_p50, decision_p50) <= 50 and max(request_p99, decision_p99) <= 200
    return Target(
        name="approval-join hop at half the auto-approved capacity (bot-approved writes, open "
        "loop), p50 / p99",
        today="936 / 1,605 ms (→ committed of an auto-approved write, faust)",
        wanted="≤ 50 / ≤ 200 ms",
        baseline=f"half of {fmt(v.get('auto_writes'), ' calls/s', 1)}",
        measured=f"request {fmt(hops[0], '')} / {fmt(hops[1], ' ms')}, decision "
        f"{fmt(hops[2], '')} / {fmt(hops[3], ' ms')} at {fmt(v.get('join_hop_rate'), ' calls/s', 1)}",
        ok=ok,
        floor="An auto-approved write has no join hop any more: the authorizer signs its "
        "receipt (→ committed p50 / p99 of the auto-approved writes: "
        f"{fmt(v.get('auto_writes_hop_commands.committed_p50_ms'), '')} / "
        f"{fmt(v.get('auto_writes_hop_commands.committed_p99_ms'), ' ms')}). The join's own "
        "hop is one PostgreSQL transaction per poll batch (with its commit's flush), the "
        "broker's acknowledgement of what it published, and its offset commit. The rate "
        f"asked is {_pct(ratio(v.get('join_hop_rate'), v.get('writes')))} of the pipeline's "
        f"bot-approved capacity ({fmt(v.get('writes'), ' calls/s', 1)}, above): every process "
        "competes for the cores, and the hop is mostly waiting for one; the join alone at "
        'the same rate is in docs/measurements.md ("The approval-join\'s hop"). At half that '
        f"rate ({fmt(v.get('join_quarter_hop_rate'), ' calls/s', 1)}) in the same pipeline: "
        f"request {fmt(v.get('join_quarter_request_p50_ms'), '')} / "
        f"{fmt(v.get('join_quarter_request_p99_ms'), ' ms')}, decision "
        f"{fmt(v.get('join_quarter_decision_p50_ms'), '')} / "
        f"{fmt(v.get('join_quarter_decision_p99_ms'), ' ms')} (load average "
        f"{fmt(v.get('join_quarter_load_average'), '', 1)}, against "
        f"{fmt(v.get('join_load_average'), '', 1)} at the asked rate). The join runs in the "
        "streams worker (a child of `ratifier streams`): its profile under bot-approved writes "
        "is the approved-writes row's, below.",
        profile="writes",
    )


def _read_chain_targets(v: dict[str, Any], cpu: float | None) -> list[Target]:
    """Issue 46's rows: the read path against B2r, the chain that matches a read (an agent's
    publish, three relay hops, the last one GETting from the provider, a consumer delivering
    to the caller), measured in the same run."""
    t2 = ratio(v.get("e2e_reads"), v.get("B2r"))
    cpu_x = ratio(cpu, v.get("B2r_cpu_us"))
    p50, p99 = v.get("lat_p50"), v.get("lat_p99")
    base50, base99 = v.get("B2r_lathalf_p50"), v.get("B2r_lathalf_p99")
    p50_x, p99_x = ratio(p50, base50), ratio(p99, base99)
    idle_x = ratio(v.get("idle_p50"), v.get("B2r_lat50_p50"))
    same = "the profiles are those of the B2 rows above"
    return [
        Target(
            name="T2 read calls end to end vs B2r (issue 46)",
            today="— (B2r new in this run)",
            wanted="≥ 50 %",
            baseline=f"B2r {fmt(v.get('B2r'), ' rec/s')} (B2r-pg {fmt(v.get('B2r_pg'), ' rec/s')})",
            measured=f"{fmt(v.get('e2e_reads'), ' calls/s')} = {_pct(t2)}",
            ok=None if t2 is None else t2 >= 0.5,
            floor=f"CPU-bound as T2 vs B2 ({same}).",
        ),
        Target(
            name="CPU per read call, all ratifier processes, vs B2r's CPU per record (issue 46)",
            today="—",
            wanted="≤ 3×",
            baseline=f"B2r {fmt(v.get('B2r_cpu_us'), ' µs', 1)} per record (3 hops + a GET; "
            f"B2r-pg {fmt(v.get('B2r_pg_cpu_us'), ' µs', 1)})",
            measured=f"{fmt(cpu, ' µs')} = {_times(cpu, v.get('B2r_cpu_us'))}",
            ok=None if cpu_x is None else cpu_x <= 3,
            floor=f"CPU per call by process: {_cpu_parts(v)} µs ({same}).",
        ),
        Target(
            name="T4 at half of T2's load vs B2r at half of its load, p50 / p99 (issue 46)",
            today="—",
            wanted="≤ 2× / ≤ 3×",
            baseline=f"B2r lat {fmt(base50, '', 1)} / {fmt(base99, ' ms', 1)} at "
            f"{fmt(v.get('B2r_lathalf_rate'), ' rec/s')}",
            measured=f"{fmt(p50, '', 1)} / {fmt(p99, ' ms', 1)} = {_times(p50, base50)} / "
            f"{_times(p99, base99)} at {fmt(v.get('lat_rate'), ' calls/s')} (to the outcome's "
            "delivery in the client)",
            ok=None if p50_x is None or p99_x is None else p50_x <= 2 and p99_x <= 3,
            floor=f"As T4 vs B2 ({same}).",
        ),
        Target(
            name="one call on an idle pipeline vs B2r's p50 at 50 records/s (issue 46)",
            today="—",
            wanted="≤ 1.5×",
            baseline=f"B2r lat p50 {fmt(v.get('B2r_lat50_p50'), ' ms', 1)}",
            measured=f"{fmt(v.get('idle_p50'), ' ms', 1)} = "
            f"{_times(v.get('idle_p50'), v.get('B2r_lat50_p50'))}",
            ok=None if idle_x is None else idle_x <= 1.5,
            floor=f"As the idle row vs B2 ({same}).",
        ),
    ]


def targets(v: dict[str, Any], found: dict[str, tuple[str, dict[str, Any]]]) -> list[Target]:
    cores = os.cpu_count() or 1
    t1 = ratio(v.get("T1_loop"), v.get("B1"))
    t2 = ratio(v.get("e2e_reads"), v.get("B2"))
    t3 = ratio(v.get("executor_dedup"), v.get("executor_nodedup"))
    cpu = _cpu_of(v)
    cpu_x = ratio(cpu, v.get("B2_cpu_us"))
    p50, p99 = v.get("lat_p50"), v.get("lat_p99")
    p50_x, p99_x = ratio(p50, v.get("B2_lat_p50")), ratio(p99, v.get("B2_lat_p99"))
    lat_ok = None if p50_x is None or p99_x is None else p50_x <= 2 and p99_x <= 2
    idle_x = ratio(v.get("idle_p50"), v.get("B2_lat_p50"))
    first, second = v.get("t5_short_first_ms"), v.get("t5_short_second_ms")
    t5_x = ratio(first, second)
    rss_ok, rss_measured, rss_floor = _rss_verdict(v.get("rss"))
    hop_p50 = {t.value: v.get(f"hop_{t.value}_p50_ms") for t in HOP_TOPICS[1:]}
    hop_measured = {
        t: float(ms) for t, ms in hop_p50.items() if isinstance(ms, int | float) and ms == ms
    }
    slowest = max(hop_measured, key=hop_measured.__getitem__, default=None)
    idle_hops = {t.value: v.get(f"idle_hop_{t.value}_p50_ms") for t in HOP_TOPICS[1:]}
    loop_extra = (
        v["T1_loop_cpu_us"] - v["B1_cpu_us"]
        if isinstance(v.get("T1_loop_cpu_us"), int | float)
        and isinstance(v.get("B1_cpu_us"), int | float)
        else None
    )
    ceiling = cores * 1_000_000 / cpu if cpu else None
    return [
        Target(
            name="T1 a stateless stage hop vs B1 (issue 16)",
            today="19 % (faust)",
            wanted="≥ 50 %",
            baseline=f"B1 {fmt(v.get('B1'), ' rec/s')}",
            measured=f"{fmt(v.get('T1_loop'), ' rec/s')} = {_pct(t1)} (runtime loop identity)",
            ok=None if t1 is None else t1 >= 0.5,
            floor=f"The loop identity hop costs {fmt(v.get('T1_loop_cpu_us'), ' µs', 1)} of CPU "
            f"per record against B1's {fmt(v.get('B1_cpu_us'), ' µs', 1)}: the loop adds "
            f"{fmt(loop_extra, ' µs', 1)} per record.",
            profile="loop",
        ),
        Target(
            name="T2 read calls end to end vs B2",
            today="24 % (1,710 calls/s)",
            wanted="≥ 35 %",
            baseline=f"B2 {fmt(v.get('B2'), ' rec/s')}",
            measured=f"{fmt(v.get('e2e_reads'), ' calls/s')} = {_pct(t2)}",
            ok=None if t2 is None else t2 >= 0.35,
            floor=f"At {fmt(cpu, ' µs')} of CPU per call this machine's {cores} cores allow at "
            f"most {fmt(ceiling, ' calls/s')} with every core busy on ratifier alone (the "
            "broker, PostgreSQL, Redis and the load generator share them): the rate is "
            "CPU-bound, so its floor is the CPU per call (next row) and the profiles of the "
            "busiest processes.",
            profile="reads-streams",
        ),
        Target(
            name="CPU per read call, all ratifier processes, vs B2's CPU per record",
            today="738 µs = 7.0×",
            wanted="≤ 4×",
            baseline=f"B2 {fmt(v.get('B2_cpu_us'), ' µs', 1)} per record (4 raw hops)",
            measured=f"{fmt(cpu, ' µs')} = {_times(cpu, v.get('B2_cpu_us'))} ({_cpu_parts(v)})",
            ok=None if cpu_x is None else cpu_x <= 4,
            floor=f"CPU per call by process: {_cpu_parts(v)} µs. The stream side's profile "
            "is under T2; the executor side's is here.",
            profile="reads-executor",
        ),
        Target(
            name="T3 executor with dedup vs without (median of 3 drains; issue 16)",
            today="76 %",
            wanted="≥ 80 %",
            baseline=f"without {fmt(v.get('executor_nodedup'), ' commands/s')}",
            measured=f"with {fmt(v.get('executor_dedup'), ' commands/s')} = {_pct(t3)}",
            ok=None if t3 is None else t3 >= 0.8,
            floor=f"Dedup (the Redis claim) takes the CPU per command from "
            f"{fmt(v.get('executor_nodedup_cpu_us'), ' µs')} to "
            f"{fmt(v.get('executor_dedup_cpu_us'), ' µs')}.",
            profile="t3",
        ),
        Target(
            name="T4 latency at 50 % of T2's load, p50 / p99 vs B2's chain",
            today="82 / 159 ms = 3.6× / 2.8×",
            wanted="≤ 2× / ≤ 2×",
            baseline=f"B2 lat {fmt(v.get('B2_lat_p50'), '', 1)} / {fmt(v.get('B2_lat_p99'), ' ms', 1)}",
            measured=f"{fmt(p50, '', 1)} / {fmt(p99, ' ms', 1)} = {_times(p50, v.get('B2_lat_p50'))}"
            f" / {_times(p99, v.get('B2_lat_p99'))} at {fmt(v.get('lat_rate'), ' calls/s')}",
            ok=lat_ok,
            floor="Per-hop p50 (broker append times): "
            + ", ".join(f"→ {t} {fmt(ms, ' ms')}" for t, ms in hop_p50.items())
            + (f"; the slowest hop is → {slowest}." if slowest else ".")
            + " At half load the time is spent in queues and batching windows; the stream "
            "process's profile shows what each record costs there.",
            profile="reads-streams",
        ),
        Target(
            name="latency of one call on an idle pipeline (p50, send → outcome in the client)",
            today="not in the bench (24–30 ms p50 seen from a client)",
            wanted="≤ 1.5× B2 lat p50",
            baseline=f"B2 lat p50 {fmt(v.get('B2_lat_p50'), ' ms', 1)}",
            measured=f"{fmt(v.get('idle_p50'), ' ms', 1)} = {_times(v.get('idle_p50'), v.get('B2_lat_p50'))}"
            f" (p90 {fmt(v.get('idle_p90'), ' ms', 1)}, {fmt(v.get('idle_calls'))} calls)",
            ok=None if idle_x is None else idle_x <= 1.5,
            floor="Per-hop p50 of the idle calls (broker append times): "
            + ", ".join(f"→ {t} {fmt(ms, ' ms', 1)}" for t, ms in idle_hops.items())
            + ". No CPU floor at idle: the time is the hops' produce, fetch and linger waits.",
        ),
        *_read_chain_targets(v, cpu),
        _writes_target(
            v,
            "auto_writes",
            name="auto-approved writes (no human, provider), closed loop",
            today="not measured",
            share=0.4,
            what="auto-approved write",
        ),
        _writes_target(
            v,
            "writes",
            name="approved writes (bot approver, provider), closed loop",
            today="79.1 calls/s = 4 %",
            share=0.2,
            what="approved write",
        ),
        _join_hop_target(v),
        Target(
            name="T5 first call after every connection was reset",
            today="172 ms vs 22 ms = 7.8×",
            wanted="≤ 3× the second call",
            baseline=f"second call {fmt(second, ' ms')}",
            measured=f"{fmt(first, ' ms')} = {_times(first, second)}",
            ok=None if t5_x is None else t5_x <= 3,
            floor=f"First call {fmt(first, ' ms')}, second {fmt(second, ' ms')}, the client's "
            f"send → acknowledged {fmt(v.get('t5_short_client_ms'), ' ms')}: the difference is "
            "reconnecting (no CPU floor, so no profile: the time is waits). Next step: log each "
            "client's reconnect time in the first call's hop (Kafka fetch and produce, "
            "PostgreSQL pool, Redis) and reconnect idle clients ahead of the call (a pool "
            "check and a metadata refresh on a timer shorter than the idle timeouts).",
        ),
        Target(
            name="RSS per worker process under load (issue 16)",
            today="—",
            wanted=f"≤ {RSS_LIMIT_MB} MB, stable over {_duration(v.get('rss_seconds') or 300)}",
            baseline="—",
            measured=rss_measured,
            ok=rss_ok,
            floor=rss_floor,
        ),
    ]


def render(results: Results) -> str:
    v = results.values
    run_id = v.get("run_id")
    quick = bool((v.get("plan") or {}).get("quick"))
    lines: list[str] = ["# Benchmark results", ""]
    if quick:
        lines += [
            "**Quick run** (`python -m bench --quick`): every step with tiny sizes and "
            "durations, to check that the run and this report work end to end. Its figures "
            "are not the targets' verdicts; `make bench` measures those.",
            "",
        ]
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
        f"Command: `{COMMAND}{' --quick' if quick else ''}` — run {run_id or '(no id)'}, took "
        f"{results.total_seconds / 60:.1f} min.",
        "",
        table(
            [tuple(row) for row in v.get("machine") or [("machine", "not recorded")]],
            ["machine", ""],
        ),
        "",
    ]
    found = profiles(v)
    rows = targets(v, found)
    lines += [
        f"## Targets ({ISSUE})",
        "",
        "Each target against its baseline measured in this run; *today* is the figure of the "
        f"run {ISSUE} was filed from. A target not met has its floor below, shown by a profile "
        "of the process that bounds it, and the next step.",
        "",
        table(
            [[t.name, t.today, t.wanted, t.baseline, t.measured, verdict(t.ok)] for t in rows],
            ["target", "today", "wanted", "baseline (this run)", "measured", "verdict"],
        ),
        "",
    ]
    lines += _t1_section(v)
    lines += _rss_section(v)
    lines += _floors_section(rows, found)
    lines += _settings_section(v)
    lines += _baselines_section(v)
    lines += _ratifier_section(v)
    lines += _other_checks(v)
    lines += _admission_section(v, results.errors)
    lines += _cpu_budget(v, _cpu_of(v) or 0.0)
    lines += [
        "## Separate runs added to this one",
        "",
        "Each of these is a run of its own (its commit, date and host are given), shown only "
        "when its result file carries this run's id (written after this run's `make bench`, "
        f"run {run_id or '(no id)'}); otherwise a dash and the command to run.",
        "",
    ]
    lines += _idle_section(run_id)
    lines += _approval_state_section(run_id)
    lines += replies_bench.section(run_id)
    lines += operator_bench.section(run_id)
    lines += contended_bench.section(run_id)
    lines += _capacity_section(v)
    if FLOORS:
        lines += ["## Tuning history (bench/FLOORS.md, written by hand)", "", FLOORS, ""]
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


def _t1_section(v: dict[str, Any]) -> list[str]:
    b1 = v.get("B1")

    def row(what: str, rate_key: str, cpu_key: str) -> list[str]:
        return [
            what,
            fmt(v.get(rate_key), " rec/s"),
            _pct(ratio(v.get(rate_key), b1)),
            fmt(v.get(cpu_key), " µs", 1),
        ]

    return [
        "## T1: a stateless stage hop",
        "",
        "The validator and authorizer run on the runtime's consumer loop "
        "(streams/stateless.py on runtime/loop.py). T1 measures that loop with a handler "
        "doing no work (bench/loop_identity.py: same clients, batch size, poll, isolated "
        "publishing, acknowledgements and commit), each draining the same backlog, and the "
        "real stages alone show what their work adds.",
        "",
        table(
            [
                row("B1 raw aiokafka relay (getmany → send_batch)", "B1", "B1_cpu_us"),
                row("runtime loop identity hop (T1)", "T1_loop", "T1_loop_cpu_us"),
                row(
                    "the same with the stages' tenant lanes (issue 45)",
                    "T1_lanes",
                    "T1_lanes_cpu_us",
                ),
                row("validator stage alone", "stage_validator", "stage_validator_cpu_us"),
                row("authorizer stage alone", "stage_authorizer", "stage_authorizer_cpu_us"),
            ],
            ["hop (one process, backlog drain)", "rate", "of B1", "CPU per record"],
        ),
        "",
    ]


def _rss_section(v: dict[str, Any]) -> list[str]:
    rss = v.get("rss")
    lines = ["## Memory of the worker processes under load", ""]
    if not isinstance(rss, dict) or not rss:
        return [*lines, "Not measured (the step failed or was skipped).", ""]
    first = v.get("rss_first_s")
    rows = []
    for name, r in sorted(rss.items()):
        growth = r.get("growth")
        ok = (
            None
            if growth is None
            else (r.get("max_mb") or 0) <= RSS_LIMIT_MB and growth < RSS_STABLE_GROWTH
        )
        rows.append(
            [
                name,
                fmt(r.get("max_mb"), " MB", 1),
                fmt(r.get("first_mb"), " MB", 1),
                fmt(r.get("end_mb"), " MB", 1),
                _pct(growth) if growth is None else f"{growth * 100:+.1f} %",
                verdict(ok),
            ]
        )
    return [
        *lines,
        f"Open-loop reads at {fmt(v.get('rss_rate'), ' calls/s')} (50 % of T2) for "
        f"{fmt(v.get('rss_seconds'), ' s')}, resident memory (VmRSS) of every worker process "
        f"sampled every few seconds; growth is from the value at {fmt(first, ' s')} to the "
        f"end; stable = growth < {RSS_STABLE_GROWTH:.0%}. {fmt(v.get('rss_ended'))} of "
        f"{fmt(v.get('rss_calls'))} calls ended.",
        "",
        table(
            rows, ["process", "max", f"at {fmt(first, ' s')}", "at the end", "growth", "verdict"]
        ),
        "",
    ]


def _floors_section(rows: list[Target], found: dict[str, tuple[str, dict[str, Any]]]) -> list[str]:
    missed = [t for t in rows if t.ok is not True]
    lines = ["## Floors of the targets not met", ""]
    if not missed:
        return [*lines, "Every target is met.", ""]
    shown: dict[str, str] = {}
    for t in missed:
        lines += [f"### {t.name}: {verdict(t.ok).strip('*')}", "", t.floor, ""]
        if t.profile is None:
            continue
        profiled = found.get(t.profile)
        if profiled is None:
            lines += ["No profile was recorded for it (py-spy missing, or the step failed).", ""]
            continue
        who, frames = profiled
        if t.profile in shown:
            lines += [f"Profile: {who}, as under {shown[t.profile]} above.", ""]
        else:
            shown[t.profile] = t.name
            lines += [f"Profile: {who}.", "", *_profile_tables(frames)]
        lines += [f"**{floor_line(frames, who.split(' (')[0].split(',')[0])}**", ""]
    return lines


def _settings_section(v: dict[str, Any]) -> list[str]:
    settings = v.get("latency_settings")
    lines = [
        "## Settings used",
        "",
        "Latency settings of the baselines and of the pipeline (read from the code that builds "
        "the clients when the run started); the baselines use the pipeline's client factories "
        "(runtime/clients.py) and the pipeline's fetch pacing (`prompt_fetches`, since issue 46), so "
        "linger, fetch wait and fetch pacing are alike:",
        "",
    ]
    if settings:
        lines += [
            table(
                [list(row) for row in settings],
                ["who", "producer linger", "consumer fetch wait", "poll"],
            ),
            "",
        ]
    else:
        lines += ["Not recorded by this run.", ""]
    return [
        *lines,
        "- Producers: `acks=all` everywhere (runtime clients and "
        "relays with the idempotent producer).",
        "- Consumers of the runtime loop: offsets committed after outputs are acknowledged; "
        "`isolation_level=read_committed`, session timeout 6 s.",
        "- PostgreSQL: `synchronous_commit=on`, `fsync=on`. Redis: default persistence of the "
        "local service.",
        f"- Topics: {12} partitions, replication factor 1 (one broker). Envelopes "
        f"{fmt(v.get('envelope_bytes'), ' B')} (get_payment with a signed context token). "
        f"Reads are spread over {BENCH_PAYMENTS} payments of the benchmark's own database "
        "`ratifier_bench` (the ledger re-reads the resource `FOR UPDATE`; one hot row would "
        "serialize every transaction).",
        "",
    ]


def _baselines_section(v: dict[str, Any]) -> list[str]:
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
            "B2 lat",
            f"raw {HOPS}-hop chain latency at {fmt(v.get('B2_lat_rate'))} records/s (send → after the last hop)",
            f"p50 {fmt(v.get('B2_lat_p50'), ' ms', 1)}, p99 {fmt(v.get('B2_lat_p99'), ' ms', 1)}, p99.9 {fmt(v.get('B2_lat_p999'), ' ms', 1)}",
            "",
        ],
        [
            "B2r",
            "a read's chain (issue 46): 3 raw hops, the last one GETting each record from the "
            "fake provider (all of a batch's at once), fetch pacing as the pipeline's",
            fmt(v.get("B2r"), " rec/s"),
            fmt(v.get("B2r_cpu_us"), " µs CPU/rec", 1),
        ],
        [
            "B2r-pg",
            "the same, the last hop doing what the executor does for a batch of reads instead "
            "(parse, one payments query, one row per record, one commit)",
            fmt(v.get("B2r_pg"), " rec/s"),
            fmt(v.get("B2r_pg_cpu_us"), " µs CPU/rec", 1),
        ],
        *(
            [
                f"B2r lat {name}",
                f"B2r's latency at {fmt(v.get(f'B2r_lat{name}_rate'))} records/s (send → "
                "delivered to a consumer after the last hop)",
                f"p50 {fmt(v.get(f'B2r_lat{name}_p50'), ' ms', 1)}, p99 "
                f"{fmt(v.get(f'B2r_lat{name}_p99'), ' ms', 1)}, p99.9 "
                f"{fmt(v.get(f'B2r_lat{name}_p999'), ' ms', 1)}",
                "",
            ]
            for name in ("50", "half")
        ),
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
    return [
        "## Baselines (the limits on this machine)",
        "",
        table(rows, ["id", "baseline", "measured", "CPU"]),
        "",
    ]


def _ratifier_section(v: dict[str, Any]) -> list[str]:
    stage_rows = [
        [
            f"{stage} stage alone (backlog drain, one worker"
            + (
                "; auto reads left for it to commit, as an older authorizer's records are)"
                if stage == "approval-join"
                else ")"
            ),
            fmt(v.get(f"stage_{stage}"), " calls/s"),
            fmt(v.get(f"stage_{stage}_cpu_us"), " µs CPU/call"),
        ]
        for stage in ("validator", "authorizer", "approval-join", "executor")
    ]
    processes = v.get("e2e_processes") or v.get("pipeline_processes")
    drains = v.get("executor_drains") or []
    order = v.get("executor_drain_order") or []
    drain_text = ", ".join(
        f"{d:,.0f} ({o})" if i < len(order) else f"{d:,.0f}"
        for i, d, o in zip(range(len(drains)), drains, [*order, *[""] * len(drains)], strict=False)
    )
    rows = [
        [
            "read calls end to end, closed loop (window "
            f"{fmt(v.get('e2e_window'))} in flight; worker processes: "
            f"{', '.join(processes) if processes else '—'})",
            fmt(v.get("e2e_reads"), " calls/s"),
            f"{fmt(_cpu_of(v), ' µs CPU/call')} ({_cpu_parts(v)})",
        ],
        [
            f"latency, open loop at {fmt(v.get('lat_rate'), ' calls/s')} (50 %), proposed_at → outcome `at`, {fmt(v.get('lat_samples'))} calls",
            f"p50 {fmt(v.get('lat_p50'), ' ms', 1)}, p99 {fmt(v.get('lat_p99'), ' ms', 1)}, p99.9 {fmt(v.get('lat_p999'), ' ms', 1)}",
            "",
        ],
        [
            "where the latency goes (p50 / p99 between the broker append times of a call's "
            "records): proposed → validated (validator), → authorized (authorizer), → "
            "committed (the authorizer, in the same batch: reads need no join), → outcome "
            "(executor)",
            " / ".join(
                f"{fmt(v.get(f'hop_{t.value}_p50_ms'), ' ms')} / {fmt(v.get(f'hop_{t.value}_p99_ms'), ' ms')}"
                for t in HOP_TOPICS[1:]
            ),
            "",
        ],
        [
            f"one read call at a time on the idle pipeline ({fmt(v.get('idle_calls'))} calls, "
            f"{fmt(v.get('idle_gap_s'), ' s', 1)} apart), the client's send → outcome arrival; "
            "per-hop p50 (broker append times) → validated / → authorized / → committed / → "
            "outcome",
            f"p50 {fmt(v.get('idle_p50'), ' ms', 1)}, p90 {fmt(v.get('idle_p90'), ' ms', 1)}, "
            f"max {fmt(v.get('idle_max'), ' ms', 1)}",
            " / ".join(fmt(v.get(f"idle_hop_{t.value}_p50_ms"), " ms", 1) for t in HOP_TOPICS[1:]),
        ],
        [
            "auto-approved writes (propose_refund by a `refund_auto` agent, "
            '`@approval("auto")`: no human; provider), closed loop 200',
            fmt(v.get("auto_writes"), " calls/s", 1),
            f"p50 {fmt(v.get('auto_writes_p50'), ' ms')}; {v.get('auto_writes_statuses', '—')}",
        ],
        [
            "approved writes (propose_refund, bot approver, provider), closed loop 200",
            fmt(v.get("writes"), " calls/s", 1),
            f"p50 {fmt(v.get('writes_p50'), ' ms')}; {v.get('writes_statuses', '—')}",
        ],
        *stage_rows,
        [
            "T3: executor alone, fresh write commands (`add_payout_account`, approved; median "
            "of 3 drains), Redis claim off (`RATIFIER_EXECUTOR__REDIS_FAST_PATH=false`, the "
            "ledger alone dedups)",
            fmt(v.get("executor_nodedup"), " commands/s"),
            fmt(v.get("executor_nodedup_cpu_us"), " µs CPU/call"),
        ],
        [
            "T3: same, Redis claim on (the default); drains in order: "
            + (drain_text or "—")
            + " commands/s",
            fmt(v.get("executor_dedup"), " commands/s"),
            fmt(v.get("executor_dedup_cpu_us"), " µs CPU/call"),
        ],
        [
            "T3 reference: Redis claim on, group commit off "
            "(`RATIFIER_EXECUTOR__GROUP_COMMIT=false`: a transaction per command; one drain)",
            fmt(v.get("executor_dedup_nogc"), " commands/s"),
            fmt(v.get("executor_dedup_nogc_cpu_us"), " µs CPU/call"),
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
    return ["## ratifier", "", table(rows, ["what", "measured", "CPU / note"]), ""]


FLOOD_COMMAND = "make test-admission-flood"


def flood_of(v: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """This run's noisy-neighbour figures (measured by its flood step, bench/flood.py), or
    None and why there are none: figures of another run, or from before run ids (an older
    run copied them from whatever test-artifacts/admission-flood.json was left), are not
    this run's."""
    flood = v.get("flood")
    run_id = v.get("run_id")
    if not isinstance(flood, dict) or not flood:
        return None, f"not measured in this run ({FLOOD_COMMAND})"
    if not run_id or flood.get("run_id") != run_id:
        return None, (
            f"not measured in this run ({FLOOD_COMMAND}): the figures in the results belong "
            f"to run {flood.get('run_id') or '(no id)'}"
        )
    return flood, ""


def _admission_section(v: dict[str, Any], errors: dict[str, str] | None = None) -> list[str]:
    """Issue 27: admission's CPU per call against a whole read call's, and the noisy
    neighbour (B's median during A's flood over B's median alone), measured in this run."""
    if "admission_plain_cpu_us" not in v:
        return []
    cpu = _cpu_of(v)
    admitted, refused = v.get("admission_cost_admitted_us"), v.get("admission_cost_refused_us")
    share = ratio(admitted, cpu) if cpu else None
    flood, why_not = flood_of(v)
    published = v.get("admission_refused_published_cpu_us")
    # Runs before this figure existed render as they did.
    through_kafka = (
        [
            f"| validator CPU per refused record, handled and published to Kafka (batches of "
            f"2,400, as a flood's fetches bring them) | {fmt(published, ' µs', 1)} | — | — |"
        ]
        if published is not None
        else []
    )
    if flood is None:
        failed = next(
            (e for step, e in (errors or {}).items() if step.startswith("noisy neighbour")), ""
        )
        noisy_row = (
            f"| noisy neighbour: B's p50 during A's flood ÷ B's p50 alone | — {why_not}"
            f"{'; the step failed: ' + failed if failed else ''} | ≤ 2 | — |"
        )
    else:
        alone, loaded = flood.get("b_alone_p50_ms"), flood.get("b_flood_p50_ms")
        noisy = ratio(loaded, alone)
        noisy_row = (
            f"| noisy neighbour: B's p50 during A's flood ÷ B's p50 alone ({fmt(flood.get('flood'))} "
            f"reads of A in this run: `{flood.get('command', '—')}`; the test's own bounds: "
            f"{flood.get('test', '—')}) | {fmt(noisy, '', 2)} ({fmt(loaded, ' ms')} / "
            f"{fmt(alone, ' ms')}; A admitted {fmt(flood.get('a_admitted'))}, refused "
            f"{fmt(flood.get('a_refused'))}, slowest refusal {fmt(flood.get('slowest_refusal_s'), ' s', 2)}) "
            f"| ≤ 2 | {verdict(noisy <= 2 if noisy is not None else None)} |"
        )
    return [
        "",
        "### Admission (issue 27)",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
        f"| admission CPU per admitted call (validator + one Lua call per batch) | "
        f"{fmt(admitted, ' µs', 1)} = {_pct(share)} of a read call's {fmt(cpu, ' µs')} | "
        f"≤ 5 % | {verdict(share <= 0.05 if share is not None else None)} |",
        f"| validator CPU per refused record (parse, verify, Lua, `rate_limited` outcome) | "
        f"{fmt(v.get('admission_refused_cpu_us'), ' µs', 1)} (+{fmt(refused, ' µs', 1)} over "
        f"validating) | — | — |",
        *through_kafka,
        *_scheduling_rows(v, admitted, cpu),
        noisy_row,
        "",
    ]


def _scheduling_rows(v: dict[str, Any], admitted: Any, cpu: float | None) -> list[str]:
    """Issue 45: the tenant lanes' cost per record (T1 with lanes minus T1), admission and
    scheduling together per admitted call against a read call's CPU, and refusals per second
    per core (validator CPU per refused record, published)."""
    lanes, plain = v.get("T1_lanes_cpu_us"), v.get("T1_loop_cpu_us")
    if not isinstance(lanes, int | float) or not isinstance(plain, int | float):
        return []
    scheduling = lanes - plain
    both = scheduling + admitted if isinstance(admitted, int | float) else None
    share = ratio(both, cpu) if cpu else None
    published = v.get("admission_refused_published_cpu_us")
    per_core = 1e6 / published if isinstance(published, int | float) and published > 0 else None
    return [
        f"| scheduling in tenant lanes, CPU per record (T1 with lanes {fmt(lanes, ' µs', 1)} − "
        f"T1 {fmt(plain, ' µs', 1)}) | {fmt(scheduling, ' µs', 1)} | — | — |",
        f"| admission and scheduling per admitted call (issue 45) | {fmt(both, ' µs', 1)} = "
        f"{_pct(share)} of a read call's {fmt(cpu, ' µs')} | ≤ 5 % | "
        f"{verdict(share <= 0.05 if share is not None else None)} |",
        f"| refusals per second per core (1 s ÷ the validator's CPU per refused record, "
        f"published) | {fmt(per_core, '/s')} | — | — |",
    ]


def t6_correct(v: dict[str, Any]) -> bool | None:
    """T6 without its recovery time (None: not measured in this run): refunds were sent,
    every call settled, nothing done or answered twice, every effect reported."""
    dup = v.get("t6_duplicates")
    if not isinstance(dup, dict):
        return None
    return (
        bool(v.get("t6_complete"))
        and dup.get("unsettled") == 0
        and dup.get("duplicates") == 0
        and dup.get("applied_not_succeeded") == 0
        and dup.get("succeeded_not_applied") == 0
        and (dup.get("writes") or 0) > 0
    )


def t6_verdict(v: dict[str, Any]) -> tuple[bool | None, str]:
    """T6 (None: not measured in this run) and what it found: recovered within 30 s, every
    call settled, nothing done or answered twice, every effect reported (bench.duplicates)."""
    dup = v.get("t6_duplicates")
    if "t6_recovered_s" not in v or not isinstance(dup, dict):
        return None, "not measured in this run"
    recovered = v.get("t6_recovered_s")
    ok = recovered is not None and recovered <= 30 and t6_correct(v) is True
    measured = (
        f"recovered after {fmt(recovered, ' s')} (≥ 90 % of {fmt(v.get('t6_pre_rate'), ' calls/s')}); "
        f"{fmt(dup.get('calls'))} calls ({fmt(dup.get('writes'))} refunds of "
        f"{fmt(dup.get('keys'))} keys, {fmt(dup.get('effects'))} effects), "
        f"{fmt(dup.get('unsettled'))} unsettled; effects applied twice "
        f"{fmt(dup.get('effects_applied_twice'))}, keys with two ledger entries "
        f"{fmt(dup.get('ledger_entries_twice'))}, calls settled twice "
        f"{fmt(dup.get('settled_twice'))}, keys settled differently "
        f"{fmt(dup.get('keys_settled_differently'))}; effects not reported succeeded "
        f"{fmt(dup.get('applied_not_succeeded'))}, succeeded without an effect "
        f"{fmt(dup.get('succeeded_not_applied'))}"
    )
    return ok, measured


def _other_checks(v: dict[str, Any]) -> list[str]:
    """Guarantees and earlier targets the run still checks (not rows of the issue's table);
    every figure of this run."""
    cpu = _cpu_of(v)
    pure_vc = sum(
        v.get(k) or 0 for k in ("pure_validate_us", "pure_verify_us", "pure_authorize_us")
    )
    t7 = ratio(pure_vc, cpu) if cpu else None
    t6_ok, t6_measured = t6_verdict(v)
    rows = [
        [
            "T6",
            "kill one executor under reads and refunds (a quarter of them retried with the "
            "same key): recovered ≤ 30 s, every call settled, 0 effects applied twice, 0 keys "
            "with two ledger entries, 0 calls settled twice, every effect reported",
            t6_measured,
            verdict(t6_ok),
        ],
        [
            "T7",
            "validation + authorization CPU ≤ 15 % of per-call total",
            f"({fmt(v.get('pure_validate_us'), '', 1)} + {fmt(v.get('pure_verify_us'), '', 1)} + {fmt(v.get('pure_authorize_us'), '', 1)}) µs / {fmt(cpu, ' µs')} = {fmt(t7 and t7 * 100, ' %', 1)}",
            verdict(None if t7 is None else t7 <= 0.15),
        ],
    ]
    return [
        "## Other checks (guarantees and earlier targets)",
        "",
        table(rows, ["check", "wanted", "measured", "verdict"]),
        "",
        "T5 in this run is the target row above: after a short idle every TCP "
        "connection of the workers (Kafka, PostgreSQL, Redis) is closed by the kernel "
        f"(`ss -K`; {v.get('t5_short_note', '—')}), which is the state a long idle leaves "
        "behind (broker `connections.max.idle.ms` 10 min, client `connections_max_idle_ms` "
        "9 min, NAT/firewall idle timers). A real 30-minute idle is `make bench-idle`, a "
        "separate run (below, when it was measured with this run).",
        "",
        "T6 detail: outcomes per second around the kill (second 0 = SIGKILL), from the outcome "
        f"timestamps: {v.get('t6_buckets', '—')} (from −5 s). Repeated outcome records of "
        "one call (a redelivered command answered again, from the ledger for a write): "
        f"{fmt(v.get('t6_repeated_outcomes'))}; duplicates are counted per idempotency key "
        "through every name an effect can be filed under (bench/duplicates.py).",
        "",
    ]


def _idle_section(run_id: str | None) -> list[str]:
    """T5 for real (`make bench-idle`), when it was measured with this run: its own commit,
    date and host, never presented as this run's figures."""
    result = read_result(idle_bench.RESULT_FILE)
    why_not = not_this_run(result, run_id, file="bench/idle-result.json", command="make bench-idle")
    lines = ["## T5 after a real 30-minute idle (`make bench-idle`, a separate run)", ""]
    if why_not is not None or result is None:
        return [*lines, f"— {why_not}", ""]
    first = (result.get("first") or {}).get("outcome_ms")
    ok = None if first is None else first <= 100
    return [
        *lines,
        f"`{result.get('command')}`, measured after this run's bench ({origin(result)}; "
        f"{result.get('idle_seconds', 0) / 60:g} min idle, then one read call): first call "
        f"{fmt(first, ' ms')}, second {fmt((result.get('second') or {}).get('outcome_ms'), ' ms')}, "
        f"warm p50 before the idle {fmt(result.get('warm_p50_ms'), ' ms')}. Wanted ≤ 100 ms: "
        f"{verdict(ok)}.",
        "",
    ]


def _approval_state_section(run_id: str | None) -> list[str]:
    """The approval-join's bounded state (`make bench-approvals`), when it was measured with
    this run."""
    r = read_result(approval_state.RESULT_FILE)
    why_not = not_this_run(
        r, run_id, file="bench/approval-state-result.json", command="make bench-approvals"
    )
    if why_not is not None or r is None:
        return ["## Approval-join state", "", f"— {why_not}", ""]
    mb = 1024 * 1024
    return [
        "## Approval-join state",
        "",
        f"`{r['command']}` ({origin(r)}; the join's pure state machine with signed "
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
    return [
        f"CPU budget (T2): the closed loop spent {fmt(e2e_cpu, ' µs')} of ratifier process CPU "
        f"per call ({_by_process(v.get('e2e_cpu_by_process')) or '—'}). This machine's "
        f"{cores} cores give {cores * 1_000_000:,} µs of CPU per second, so ratifier's "
        f"processes alone could not pass {fmt(ceiling, ' calls/s')} even with every core busy "
        "on them, before the broker's, PostgreSQL's, Redis's and the load generator's own CPU; "
        f"measured {fmt(rate, ' calls/s')} ({fmt(rate / ceiling * 100, ' %')} of that ceiling). "
        f"B2's {fmt(v.get('B2_cpu_us'), ' µs', 1)} per record for four raw hops is the "
        "transport's share of the 1,000 µs per call the CPU target allows.",
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
