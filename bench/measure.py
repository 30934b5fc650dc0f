"""What `make bench` measures: every baseline and every ratifier figure, on the same broker,
topics shape and envelope size. Each measurement returns a dict of named values;
:class:`Measurements` runs them as steps (each under its own time limit, its error recorded
instead of stopping the run, the whole under ``BUDGET_SECONDS``) and hands the results to
:mod:`bench.report`, which renders bench/RESULTS.md from them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import time
import traceback
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from approvals.signing import approval_keys, sign_decision, statement_for
from bench import idle as idle_bench
from bench.common import (
    BENCH_PAYMENTS,
    HOP_TOPICS,
    HOPS,
    LOG_ROOT,
    SPY_RATE,
    BenchRun,
    OutcomeWatcher,
    Proposer,
    agent_token,
    child_pids,
    cpu_seconds,
    create_topics,
    drain,
    is_executor,
    percentile,
    read_envelopes,
    reset_payments,
    rss_mb,
    start_spy,
    stop_spy,
)
from bench.duplicates import Call, count_duplicates
from bench.provenance import new_run_id
from bench.report import Results
from commands.sql import named_query
from config.settings import Settings
from runtime.clients import LINGER_MS, kafka_consumer, kafka_producer, pg_connect, redis_client
from schemas.envelopes import Actor, ApprovalVerdict
from schemas.lanes import LANE_SEPARATOR
from schemas.names import Topic

# T3 took 397 s of its 420 on 2026-12-03 at 13:00 and ran out at 15:41 (eight drains of
# ~55 s on a slow spell of this machine): it has 540, the whole run 21 minutes.
BUDGET_SECONDS = 21 * 60
QUICK_BUDGET_SECONDS = 8 * 60


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How much each step measures. The full plan is `make bench`; the quick one
    (`python -m bench --quick`) runs every step with tiny sizes and durations so that the
    report renders end to end in a few minutes (its figures are not the targets' verdicts)."""

    quick: bool = False
    budget_seconds: float = BUDGET_SECONDS
    n: int = 20000  # records per baseline drain (B1, B2, T1)
    stage_n: int = 4000  # calls per stage-alone drain
    executor_n: int = 4000  # commands per T3 drain
    pure_n: int = 5000
    chain_latency_seconds: float = 15
    redis_n: int = 5000
    postgres_n: int = 500
    closed_seconds: float = 20
    closed_warmup: float = 5
    latency_seconds: float = 20
    writes_seconds: float = 15
    # One call at a time on the idle pipeline, this many, this far apart.
    idle_calls: int = 30
    idle_gap: float = 0.5
    profile_seconds: float = 12
    # RSS under load at 50 % of T2: growth is measured from the value after `rss_first`.
    rss_seconds: float = 300
    rss_first: float = 60
    rss_interval: float = 5
    idle_seconds: float = 30
    kill_seconds: float = 40
    kill_at: float = 12
    # T6's auto-approved refunds per second beside its reads (a quarter of them retried).
    kill_write_rate: float = 20
    # The noisy neighbour (tests/e2e/test_admission.py): tenant A's flood, and whether the
    # strict bounds of `make test-admission-flood` apply.
    flood: int = 20_000
    flood_strict: bool = True


FULL = Plan()
QUICK = Plan(
    quick=True,
    budget_seconds=QUICK_BUDGET_SECONDS,
    n=3000,
    stage_n=1200,
    executor_n=300,
    pure_n=300,
    chain_latency_seconds=4,
    redis_n=300,
    postgres_n=30,
    closed_seconds=5,
    closed_warmup=2,
    latency_seconds=5,
    writes_seconds=5,
    idle_calls=8,
    idle_gap=0.3,
    profile_seconds=4,
    rss_seconds=30,
    rss_first=6,
    rss_interval=2,
    idle_seconds=3,
    kill_seconds=14,
    kill_at=5,
    kill_write_rate=10,
    flood=2_000,
    flood_strict=False,
)

log = logging.getLogger("bench")


@dataclass
class Measurements:
    budget_seconds: float = BUDGET_SECONDS
    started: float = field(default_factory=time.monotonic)
    # This run's id (bench.provenance): in its results, and in every result file a separate
    # command writes with it.
    run_id: str = field(default_factory=new_run_id)
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def left(self) -> float:
        return self.budget_seconds - (time.monotonic() - self.started)

    async def step(
        self, name: str, limit: float, action: Callable[[], Awaitable[dict[str, Any]]]
    ) -> None:
        limit = min(limit, self.left() - 15)
        clock = time.monotonic() - self.started
        if limit < 15:
            self.errors[name] = "skipped: the run's time budget is spent"
            print(f"[{clock:6.0f}s] {name}: skipped (budget)", flush=True)
            return
        print(f"[{clock:6.0f}s] {name} … (limit {limit:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            found = await asyncio.wait_for(action(), timeout=limit)
            self.values.update(found)
            shown = ", ".join(f"{k}={_short(v)}" for k, v in found.items())
            print(f"          {name}: {shown}", flush=True)
        except Exception as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"          {name} FAILED: {self.errors[name]}", flush=True)
            traceback.print_exc()
        self.timings[name] = time.monotonic() - began

    def results(self) -> Results:
        """What was measured so far, with the machine as it is now (a later render must not
        describe another one)."""
        return Results(
            values={**self.values, "run_id": self.run_id, "machine": machine()},
            errors=dict(self.errors),
            timings=dict(self.timings),
            total_seconds=time.monotonic() - self.started,
        )


def _short(v: Any) -> str:
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


# --- baselines ---------------------------------------------------------------------------------


async def baselines_kafka(n: int) -> dict[str, Any]:
    """B1 (raw relay), B2 (raw 4-hop chain) and T1's stateless stage hop (the runtime loop
    with a handler doing no work), each draining the same backlog of ``n`` envelopes. (B3,
    faust's identity agent, left with faust: issue 44.)"""
    run = BenchRun.create("baselines")
    try:
        await run.prepare()
        p = run.settings.topic_prefix
        t = run.settings.topic
        hops = [f"{p}hop{i}" for i in range(HOPS + 1)]
        await create_topics(run, hops)
        envelopes = read_envelopes(run.settings, n, uuid.uuid4().hex[:6])
        out: dict[str, Any] = {"envelope_bytes": statistics.mean(len(e) for e in envelopes)}

        def one_relay() -> list[Any]:
            return [run.start_module("bench.relay", "b1-relay", hops[0], hops[1], f"{p}b1")]

        rate, cpu = await drain(run, one_relay, hops[0], hops[1], n, envelopes, 300)
        out |= {"B1": rate, "B1_cpu_us": cpu}

        def chain() -> list[Any]:
            return [
                run.start_module("bench.relay", f"b2-relay{i}", hops[i], hops[i + 1], f"{p}b2-{i}")
                for i in range(HOPS)
            ]

        # hops[0] already holds the backlog; the chain's groups start from the beginning.
        rate, cpu = await drain(run, chain, hops[0], hops[HOPS], n, None, 300)
        out |= {"B2": rate, "B2_cpu_us": cpu}

        # B2r (issue 46): a read's chain, three relay hops, the last with a read's I/O: an
        # HTTP GET per record to the fake provider (B2r, the issue's), or what the executor
        # does for a batch of reads in PostgreSQL (B2r-pg). Each drains its own backlog.
        run.start_provider()
        for key, work in (("B2r", f"get:{run.settings.provider_url}"), ("B2r_pg", "pg")):
            read_hops = [f"{p}{key.lower()}{i}" for i in range(READ_HOPS + 1)]
            await create_topics(run, read_hops)
            rate, cpu = await drain(
                run,
                read_chain(run, read_hops, key.lower(), work),
                read_hops[0],
                read_hops[READ_HOPS],
                n,
                envelopes,
                300,
            )
            out |= {key: rate, f"{key}_cpu_us": cpu}

        def loop_hop(target: Topic, group: str, *mode: str) -> Callable[[], list[Any]]:
            def start() -> list[Any]:
                return [
                    run.start_module(
                        "bench.loop_identity",
                        group,
                        Topic.PROPOSED.value,
                        target.value,
                        p + group,
                        *mode,
                    )
                ]

            return start

        # Keyed as agents key their calls (<tenant>#<lane>, schemas/lanes.py), 8 tenants.
        rate, cpu = await drain(
            run,
            loop_hop(Topic.VALIDATED, "t1-loop"),
            t(Topic.PROPOSED),
            t(Topic.VALIDATED),
            n,
            envelopes,
            300,
            keys=lambda i: f"tenant-{i % 8}{LANE_SEPARATOR}{i % 4}".encode(),
        )
        out |= {"T1_loop": rate, "T1_loop_cpu_us": cpu}
        # The same backlog again through the loop with the stages' tenant lanes (issue 45: the
        # scheduling's cost per record is the difference).
        rate, cpu = await drain(
            run,
            loop_hop(Topic.COMMITTED, "t1-lanes", "lanes"),
            t(Topic.PROPOSED),
            t(Topic.COMMITTED),
            n,
            None,
            300,
        )
        out |= {"T1_lanes": rate, "T1_lanes_cpu_us": cpu}
        # Its profile from a second drain of the same backlog (another group, another
        # target): py-spy's own CPU is not in the measured figure.
        profile_path = run.log_dir / "profile-t1-loop.txt"
        await drain(
            run,
            loop_hop(Topic.AUTHORIZED, "t1-loop-profile"),
            t(Topic.PROPOSED),
            t(Topic.AUTHORIZED),
            n,
            None,
            300,
            profile_to=profile_path,
        )
        out["profile_t1_loop"] = top_frames(profile_path)
        return out
    finally:
        await run.close()


READ_HOPS = 3  # a read: validator, authorizer, executor (its agent publishes the first)


def read_chain(run: BenchRun, hops: list[str], label: str, work: str) -> Callable[[], list[Any]]:
    """B2r's relays (bench/relay.py) over ``hops``, the last one doing ``work``."""

    def start() -> list[Any]:
        last = len(hops) - 2
        return [
            run.start_module(
                "bench.relay",
                f"{label}-relay{i}",
                hops[i],
                hops[i + 1],
                f"{run.settings.topic_prefix}{label}-{i}",
                *([work] if i == last else []),
            )
            for i in range(len(hops) - 1)
        ]

    return start


async def read_chain_latency(rates: dict[str, float], seconds: float) -> dict[str, Any]:
    """B2r's latency (issue 46): the read chain (3 relay hops, the last one GETting each
    record from the fake provider) at each of ``rates`` (its name → records/s): time from
    the producer's send to the record's delivery to a consumer after the last hop."""
    run = BenchRun.create("readlat")
    try:
        run.start_provider()
        out: dict[str, Any] = {}
        for name, rate in rates.items():
            out |= await chain_latency(
                rate,
                seconds,
                run=run,
                hops=READ_HOPS,
                work=f"get:{run.settings.provider_url}",
                key=f"B2r_lat{name}",
            )
        return out
    finally:
        await run.close()


async def chain_latency(
    rate: float,
    seconds: float,
    *,
    run: BenchRun | None = None,
    hops: int = HOPS,
    work: str = "",
    key: str = "B2_lat",
) -> dict[str, Any]:
    """The latency floor of the design: a raw aiokafka chain of ``hops`` relays (same
    producer settings and fetch pacing as the pipeline; the last one doing ``work``) at a
    constant rate; time from send to arrival after the last hop."""

    own = run is None
    run = run or BenchRun.create("chainlat")
    p = run.settings.topic_prefix
    tag = f"{key.lower()}{uuid.uuid4().hex[:4]}"
    topics = [f"{p}{tag}-{i}" for i in range(hops + 1)]
    relays: list[Any] = []
    try:
        await create_topics(run, topics)
        relays = read_chain(run, topics, tag, work)()
        consumer = kafka_consumer(run.settings, topics[hops], group=None)
        producer = kafka_producer(run.settings)
        await consumer.start()
        await producer.start()
        latencies: list[float] = []

        async def arrivals(timeout_ms: int) -> None:
            """Latency of each timed record that arrived after the last hop."""
            batches = await consumer.getmany(timeout_ms=timeout_ms)
            now = time.time()
            for records in batches.values():
                for r in records:
                    head = (r.value or b"").split(b"|", 1)[0]
                    if head not in (b"warm", b""):
                        latencies.append((now - float(head)) * 1000)

        warm = True
        try:
            padding = b"x" * 800
            started = time.perf_counter()
            sent = 0
            # Warm-up until the relays' groups have joined and records flow.
            while warm and time.perf_counter() - started < 120:
                await producer.send_and_wait(topics[0], value=b"warm")
                batches = await consumer.getmany(timeout_ms=1000)
                warm = not any(batches.values())
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                due = int((time.perf_counter() - began) * rate) + 1
                while sent < due:
                    await producer.send(
                        topics[0], value=f"{time.time():.6f}|".encode() + padding, key=b"%d" % sent
                    )
                    sent += 1
                await arrivals(5)
            end = time.perf_counter() + 10
            while len(latencies) < sent and time.perf_counter() < end:
                await arrivals(100)
        finally:
            await consumer.stop()
            await producer.stop()
        return {
            f"{key}_rate": rate,
            f"{key}_p50": percentile(latencies, 50),
            f"{key}_p99": percentile(latencies, 99),
            f"{key}_p999": percentile(latencies, 99.9),
            f"{key}_samples": len(latencies),
        }
    finally:
        if own:
            await run.close()
        else:
            for relay in relays:
                run.stop(relay)


async def baseline_redis(n: int) -> dict[str, Any]:
    run = BenchRun.create("redis")
    redis = redis_client(run.settings)
    prefix = f"{run.settings.topic_prefix}setnx:"
    try:
        started = time.perf_counter()
        for i in range(n):
            await redis.set(f"{prefix}a{i}", b"1", nx=True, px=60_000)
        plain = n / (time.perf_counter() - started)
        started = time.perf_counter()
        for base in range(0, n * 10, 100):
            pipe = redis.pipeline(transaction=False)
            for i in range(base, base + 100):
                pipe.set(f"{prefix}b{i}", b"1", nx=True, px=60_000)
            await pipe.execute()
        pipelined = n * 10 / (time.perf_counter() - started)
        return {"B4_plain": plain, "B4_pipelined": pipelined}
    finally:
        await redis.aclose()


def _ledger_params(run_id: str, i: int) -> dict[str, Any]:
    return {
        "tenant": "tenant-a",
        "idempotency_key": f"b5-{run_id}-{i}",
        "operation_id": f"tenant-a:b5-{run_id}-{i}",
        "call_id": f"b5-{run_id}-{i}",
        "tool": "get_payment",
        "fingerprint": "f" * 64,
        "fencing": 1,
        "payment_id": f"pay_Z{i % BENCH_PAYMENTS:04d}",
        "status": "succeeded",
        "outcome": Jsonb({"status": "succeeded"}),
        "kind": "executed",
        "detail": Jsonb({"bench": True}),
    }


def _ledger_transaction(cur: psycopg.Cursor[Any], params: dict[str, Any]) -> None:
    """The executor's ledger transaction for a read: claim, tenant-scoped FOR UPDATE
    re-read, record the outcome, audit row."""
    cur.execute(named_query("executors", "claim_operation"), params)
    cur.execute(named_query("commands.payments", "payment_by_id_for_update"), params)
    cur.execute(named_query("executors", "record_outcome"), params)
    cur.execute(named_query("executors", "insert_audit"), params)


async def baseline_postgres(n: int) -> dict[str, Any]:
    def measure() -> dict[str, Any]:
        url = BenchRun.create("pg").settings.storage.database_url
        run_id = uuid.uuid4().hex[:8]
        with pg_connect(url) as conn:
            started = time.perf_counter()
            for i in range(n):
                with conn.transaction(), conn.cursor() as cur:
                    _ledger_transaction(cur, _ledger_params(run_id, i))
            plain = n / (time.perf_counter() - started)
            # Pipeline mode: 50 transactions in flight per sync, each still its own commit.
            started = time.perf_counter()
            with conn.pipeline() as pipe:
                for i in range(n, n * 4):
                    with conn.transaction(), conn.cursor() as cur:
                        _ledger_transaction(cur, _ledger_params(run_id, i))
                    if i % 50 == 0:
                        pipe.sync()
            pipelined = n * 3 / (time.perf_counter() - started)
            # Grouped: 50 commands' ledger work in one transaction (one commit, one fsync).
            started = time.perf_counter()
            for base in range(n * 4, n * 7, 50):
                with conn.transaction(), conn.cursor() as cur:
                    for i in range(base, base + 50):
                        _ledger_transaction(cur, _ledger_params(run_id, i))
            grouped = n * 3 / (time.perf_counter() - started)
        return {"B5_plain": plain, "B5_pipelined": pipelined, "B5_grouped": grouped}

    return await asyncio.to_thread(measure)


# --- pure stage costs (for T7) -----------------------------------------------------------------


async def pure_costs(n: int) -> dict[str, Any]:
    from bench.authorizer import pure as authorizer_pure
    from bench.validator import pure as validator_pure
    from config.settings import Settings
    from runtime.identity import context_keys, verify_context_token

    settings = Settings()
    validate_us, _ = validator_pure(n)
    single, batched = authorizer_pure(min(n, 4000), 200)
    keys = context_keys(settings)
    token = agent_token(settings)
    started = time.process_time()  # CPU time: comparable with the stages' CPU per call
    for _ in range(n):
        verify_context_token(token, keys)
    verify_us = (time.process_time() - started) / n * 1e6
    return {
        "pure_validate_us": validate_us,
        "pure_verify_us": verify_us,
        "pure_authorize_us": 1e6 / batched,
        "pure_authorize_single_us": 1e6 / single,
    }


# --- ratifier stages, one at a time (throughput and CPU per call per stage) ---------------------


def seed_payments(database_url: str) -> None:
    with pg_connect(database_url) as conn:
        for i in range(BENCH_PAYMENTS):
            conn.execute(
                "INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, currency,"
                " refundable_minor, status) VALUES ('tenant-a', %s, 'bench@example.com',"
                " 1000000, 'EUR', 1000000, 'captured') ON CONFLICT DO NOTHING",
                (f"pay_Z{i:04d}",),
            )
    reset_payments(database_url)


def spread_envelopes(run: BenchRun, n: int) -> list[bytes]:
    token = agent_token(run.settings)
    from bench.common import read_proposal

    tag = uuid.uuid4().hex[:6]
    return [
        read_proposal(token, f"s-{tag}-{i}", payment_id=f"pay_Z{i % BENCH_PAYMENTS:04d}")
        for i in range(n)
    ]


async def stages_alone(n: int) -> dict[str, Any]:
    """Each stage alone in its own worker draining its input topic. The validator and the
    authorizer drain the previous stage's output; the authorizer commits these auto reads
    itself (contract v1.4; since v1.8 with no `calls.authorized` record), and the executor
    drains those commands. The approval-join, which never sees such reads, is measured on its
    own run with auto reads that an older authorizer left for it to commit
    (:func:`bench.executor.join_inputs`)."""
    from bench.executor import join_inputs

    run = BenchRun.create("stages")
    out: dict[str, Any] = {}
    try:
        await run.prepare()
        t = run.settings.topic
        chain = [
            ("validator", Topic.PROPOSED, Topic.VALIDATED),
            # Reads: committed by the authorizer, no `calls.authorized` record (v1.8).
            ("authorizer", Topic.VALIDATED, Topic.COMMITTED),
        ]
        values: list[bytes] | None = spread_envelopes(run, n)
        for stage, source, target in chain:

            def start(stage: str = stage) -> list[Any]:
                # `ratifier stages` alone: not `streams`, which also starts an idle join.
                return [run.start("stages", f"stage-{stage}", RATIFIER_STREAMS__STAGES=stage)]

            rate, cpu = await drain(run, start, t(source), t(target), n, values, 300)
            out[f"stage_{stage}"] = rate
            out[f"stage_{stage}_cpu_us"] = cpu
            values = None

        def executor() -> list[Any]:
            return [run.start("executor", "stage-executor")]

        rate, cpu = await drain(run, executor, t(Topic.COMMITTED), t(Topic.OUTCOMES), n, None, 300)
        out |= {"stage_executor": rate, "stage_executor_cpu_us": cpu}
    finally:
        await run.close()
    join_run = BenchRun.create("stage-join")
    try:
        await join_run.prepare()
        t = join_run.settings.topic

        def join() -> list[Any]:
            return [join_run.start("approval-join", "stage-approval-join")]

        inputs = join_inputs(join_run.settings, n, lambda i: f"pay_Z{i % BENCH_PAYMENTS:04d}")
        rate, cpu = await drain(
            join_run, join, t(Topic.AUTHORIZED), t(Topic.COMMITTED), n, inputs, 300
        )
        out |= {"stage_approval-join": rate, "stage_approval-join_cpu_us": cpu}
        return out
    finally:
        await join_run.close()


async def executor_drain(
    n: int, *, dedup: bool, profile_to: Path | None = None, group_commit: bool = True
) -> tuple[float, float]:
    """Fresh committed write commands (`add_payout_account`, approved, spread over the bench
    payments) drained by one executor, with or without the Redis claim fast path. Writes:
    a read takes no claim (docs/execution.md, "Reads"), so reads would compare nothing."""
    from bench.executor import write_commands

    run = BenchRun.create(("dedup" if dedup else "nodedup") + ("" if group_commit else "-nogc"))
    try:
        await run.prepare()
        # Each command's fingerprint covers its own payment id (a rewrite of the bytes after
        # fingerprinting made the executor refuse every command as precondition_failed).
        commands = write_commands(run.settings, n, lambda i: f"pay_Z{i % BENCH_PAYMENTS:04d}")
        t = run.settings.topic
        fast_path = "true" if dedup else "false"

        def executor() -> list[Any]:
            return [
                run.start(
                    "executor",
                    "executor",
                    RATIFIER_EXECUTOR__REDIS_FAST_PATH=fast_path,
                    RATIFIER_EXECUTOR__GROUP_COMMIT="true" if group_commit else "false",
                )
            ]

        return await drain(
            run,
            executor,
            t(Topic.COMMITTED),
            t(Topic.OUTCOMES),
            n,
            commands,
            300,
            profile_to=profile_to,
        )
    finally:
        await run.close()


# T3's drain order: interleaved so that a drift of the machine's load hits both alike.
T3_ORDER = (False, True, True, False, False, True)


async def executor_with_and_without_dedup(n: int) -> dict[str, Any]:
    """T3: three drains of each variant, interleaved (A-B-B-A-A-B), each figure the median
    of its three; then one more drain with dedup under py-spy (not counted)."""
    drains: list[tuple[bool, float, float]] = []
    for dedup in T3_ORDER:
        rate, cpu = await executor_drain(n, dedup=dedup)
        drains.append((dedup, rate, cpu))
    with_dedup = [d for d in drains if d[0]]
    without = [d for d in drains if not d[0]]
    out: dict[str, Any] = {
        "executor_nodedup": statistics.median(d[1] for d in without),
        "executor_nodedup_cpu_us": statistics.median(d[2] for d in without),
        "executor_dedup": statistics.median(d[1] for d in with_dedup),
        "executor_dedup_cpu_us": statistics.median(d[2] for d in with_dedup),
        "executor_drains": [d[1] for d in drains],
        "executor_drain_order": ["with" if d[0] else "without" for d in drains],
    }
    # One drain with dedup and one transaction per command, as before the group commit.
    rate, cpu = await executor_drain(n, dedup=True, group_commit=False)
    out["executor_dedup_nogc"], out["executor_dedup_nogc_cpu_us"] = rate, cpu
    profile_path = LOG_ROOT / f"profile-t3-dedup-{uuid.uuid4().hex[:6]}.txt"
    await executor_drain(n, dedup=True, profile_to=profile_path)
    out["profile_t3_dedup"] = top_frames(profile_path)
    return out


# --- the whole pipeline --------------------------------------------------------------------------


@dataclass
class Pipeline:
    run: BenchRun
    watcher: OutcomeWatcher
    proposer: Proposer
    workers: dict[str, Any]

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(w.process.pid) for name, w in self.workers.items()}

    def spy(self, label: str) -> dict[str, tuple[subprocess.Popen[bytes], Path]]:
        """py-spy on every running worker of the pipeline until :func:`collect_spies`."""
        spies = {}
        for name, worker in self.workers.items():
            if worker.process.poll() is not None:
                continue
            path = self.run.log_dir / f"profile-{label}-{name}.txt"
            spy = start_spy(worker.process.pid, path)
            if spy is not None:
                spies[name] = (spy, path)
        return spies


def collect_spies(
    spies: dict[str, tuple[subprocess.Popen[bytes], Path]],
) -> dict[str, dict[str, list[tuple[str, float]]]]:
    for spy, _path in spies.values():
        stop_spy(spy)
    return {name: top_frames(path) for name, (_spy, path) in spies.items()}


def per_call_us(before: dict[str, float], after: dict[str, float], calls: int) -> dict[str, float]:
    return {name: (after[name] - before.get(name, 0.0)) / max(calls, 1) * 1e6 for name in after}


async def start_pipeline(run: BenchRun, executors: int, streams: int = 1) -> Pipeline:
    await run.prepare()
    run.start_provider()
    workers = {"streams": run.start("streams", "streams")}
    for i in range(1, streams):
        workers[f"streams{i}"] = run.start("streams", f"streams{i}")
    for i in range(executors):
        workers[f"executor{i}"] = run.start("executor", f"executor{i}")
    watcher = OutcomeWatcher(run.settings)
    await watcher.start()
    proposer = Proposer(run.settings, watcher, agent_token(run.settings))
    await proposer.start()
    pipe = Pipeline(run=run, watcher=watcher, proposer=proposer, workers=workers)
    if not await idle_bench.wait_ready(proposer, watcher, timeout=180):
        raise RuntimeError("pipeline not ready in 180 s")
    return pipe


async def closed_loop(pipe: Pipeline, window: int, seconds: float, warmup: float) -> dict[str, Any]:
    """Keep ``window`` calls in flight; count completions over ``seconds`` after warm-up."""
    tag = uuid.uuid4().hex[:6]
    issued: list[str] = []
    done_before = 0
    end = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup
    cpu0: dict[str, float] | None = None
    completed0 = 0
    i = 0
    while time.perf_counter() < end:
        completed = sum(1 for c in issued[done_before:] if c in pipe.watcher.ended)
        in_flight = len(issued) - done_before - completed
        while in_flight < window:
            call_id = f"cl-{tag}-{i}"
            await pipe.proposer.propose(call_id, payment_id=f"pay_Z{i % BENCH_PAYMENTS:04d}")
            issued.append(call_id)
            i += 1
            in_flight += 1
        # Advance the low-water mark over finished calls.
        while done_before < len(issued) and issued[done_before] in pipe.watcher.ended:
            done_before += 1
        if cpu0 is None and time.perf_counter() >= measure_from:
            cpu0 = pipe.cpu()
            completed0 = sum(1 for c in issued if c in pipe.watcher.ended)
        await pipe.watcher.changed(0.05)
    completed1 = sum(1 for c in issued if c in pipe.watcher.ended)
    cpu1 = pipe.cpu()
    assert cpu0 is not None
    calls = max(completed1 - completed0, 1)
    rate = calls / seconds
    cpu_us = per_call_us(cpu0, cpu1, calls)
    await pipe.watcher.wait(issued, timeout=60)  # let the tail drain before the next step
    return {
        "e2e_reads": rate,
        # Every worker process the pipeline runs, whatever their names and number.
        "e2e_cpu_by_process": cpu_us,
        "e2e_cpu_us": sum(cpu_us.values()),
        "e2e_cpu_streams_us": sum(v for k, v in cpu_us.items() if not is_executor(k)),
        "e2e_cpu_executors_us": sum(v for k, v in cpu_us.items() if is_executor(k)),
        "e2e_window": window,
        "e2e_processes": sorted(pipe.workers),
    }


async def open_loop(
    pipe: Pipeline,
    rate: float,
    seconds: float,
    *,
    tag: str,
    during: Callable[[float], None] | None = None,
) -> list[str]:
    """Propose at a constant ``rate`` for ``seconds`` (schedule-driven, no coordinated
    omission: a late tick sends what is due)."""
    issued: list[str] = []
    started = time.perf_counter()
    i = 0
    while True:
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
        due = int(elapsed * rate) + 1
        while i < due:
            call_id = f"{tag}-{i}"
            await pipe.proposer.propose(call_id, payment_id=f"pay_Z{i % BENCH_PAYMENTS:04d}")
            issued.append(call_id)
            i += 1
        if during is not None:
            during(elapsed)
        await asyncio.sleep(0.002)
    await pipe.proposer.flush()
    return issued


async def latency(pipe: Pipeline, rate: float, seconds: float) -> dict[str, Any]:
    tag = f"ol-{uuid.uuid4().hex[:6]}"
    issued = await open_loop(pipe, rate, seconds, tag=tag)
    finished = await pipe.watcher.wait(issued, timeout=60)
    # To the outcome's delivery in the client (issue 46), as B2 lat and B2r lat end with
    # their record's delivery to a consumer after the last hop.
    ms = [
        (o.delivered_at - o.proposed_at) * 1000
        for c in issued
        if (o := pipe.watcher.ended.get(c)) is not None
    ]
    hops = await hop_latencies(pipe, set(issued))
    return {
        **hops,
        "lat_rate": rate,
        "lat_samples": len(ms),
        "lat_missing": len(issued) - len(ms),
        "lat_complete": finished,
        "lat_p50": percentile(ms, 50),
        "lat_p99": percentile(ms, 99),
        "lat_p999": percentile(ms, 99.9),
    }


async def hop_latencies(pipe: Pipeline, call_ids: set[str]) -> dict[str, Any]:
    """p50 and p99 of the time between consecutive topics (broker append times of each
    call's records), to see which stage the latency comes from."""

    settings = pipe.run.settings
    stamps: dict[Topic, dict[str, int]] = {t: {} for t in HOP_TOPICS}
    by_name = {settings.topic(t): t for t in HOP_TOPICS}
    consumer = kafka_consumer(
        settings,
        *by_name,
        group=None,
        max_poll_records=5000,
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=300, max_records=5000)
            for tp, records in batches.items():
                topic = by_name[tp.topic]
                for r in records:
                    try:
                        call_id = json.loads(r.value or b"").get("call_id")
                    except (ValueError, AttributeError):
                        continue
                    # The first record of a call on each topic; on `outcomes` the last
                    # (a write waiting for a human has an awaiting_approval outcome first).
                    if call_id in call_ids and (
                        call_id not in stamps[topic] or topic is Topic.OUTCOMES
                    ):
                        stamps[topic][call_id] = r.timestamp
            positions = [await consumer.position(tp) for tp in ends]
            if all(p >= ends[tp] for p, tp in zip(positions, ends, strict=True)):
                break
    finally:
        await consumer.stop()
    # A call the authorizer committed has no `calls.authorized` record (contract v1.8): its
    # authorizer's hop ends with its command, and the join's hop is nil, as before v1.8.
    for call_id, at in stamps[Topic.COMMITTED].items():
        stamps[Topic.AUTHORIZED].setdefault(call_id, at)
    out: dict[str, Any] = {}
    for a, b in itertools.pairwise(HOP_TOPICS):
        gaps = [stamps[b][c] - stamps[a][c] for c in stamps[b] if c in stamps[a]]
        out[f"hop_{b.value}_p50_ms"] = percentile(gaps, 50)
        out[f"hop_{b.value}_p99_ms"] = percentile(gaps, 99)
    return out


async def approved_writes(
    pipe: Pipeline, seconds: float, window: int, *, profiled: bool = False
) -> dict[str, Any]:
    """Refunds of 1 minor unit, each approved by a bot as soon as its request appears; with
    ``profiled``, py-spy samples every worker meanwhile (a separate, shorter run: the
    measured one is not slowed by the sampling)."""
    return await _writes(pipe, seconds, window, bot=True, profiled=profiled, key="writes")


async def auto_writes(
    pipe: Pipeline, seconds: float, window: int, *, profiled: bool = False
) -> dict[str, Any]:
    """Refunds of 1 minor unit by an agent with the ``refund_auto`` role: the policy
    `refund-small-auto-for-trusted-agents` (`@approval("auto")`) commits them with a signed
    receipt and no human, so this is the write path alone (authorizer, approval-join's
    receipt, executor's ledger and provider call), closed loop."""
    return await _writes(pipe, seconds, window, bot=False, profiled=profiled, key="auto_writes")


async def _writes(
    pipe: Pipeline, seconds: float, window: int, *, bot: bool, profiled: bool, key: str
) -> dict[str, Any]:
    """Closed loop of ``window`` refunds in flight for ``seconds``; with ``bot``, a bot
    approves each request as soon as it appears (else the policy auto-approves them)."""

    settings = pipe.run.settings
    roles = ("refund",) if bot else ("refund_auto",)
    refund_token = agent_token(settings, roles=roles, sub=f"bench-{key}")
    # The approval service signs for the approver it authenticated (approvals.signing).
    signing = approval_keys(settings)
    approver = Actor(sub="bench-approver", tenant="tenant-a", roles=("approver",))
    consumer = kafka_consumer(
        settings,
        settings.topic(Topic.APPROVALS_REQUESTED),
        group=None,
        auto_offset_reset="latest",  # "earliest" races the seek below (stale records first)
    )
    producer = kafka_producer(settings, enable_idempotence=False)
    await consumer.start()
    await producer.start()
    # Only this run's requests: an earlier run's were decided already.
    if consumer.assignment():
        await consumer.seek_to_end()
    approved = 0

    async def approve() -> None:
        nonlocal approved
        while True:
            batches = await consumer.getmany(timeout_ms=100, max_records=1000)
            for records in batches.values():
                for r in records:
                    request = json.loads(r.value or b"")
                    decision = sign_decision(
                        statement_for(
                            call_id=request["call_id"],
                            tenant=request["tenant"],
                            fingerprint=request["fingerprint"],
                            approver=approver,
                            verdict=ApprovalVerdict.APPROVE,
                            now=datetime.now(UTC),
                            validity=signing.decision_validity,
                        ),
                        signing,
                    )
                    await producer.send(
                        settings.topic(Topic.APPROVALS_DECIDED),
                        key=decision.call_id.encode(),
                        value=decision.to_bytes(),
                    )
                    approved += 1

    bot_task = asyncio.create_task(approve()) if bot else None
    writer = Proposer(settings, pipe.watcher, refund_token)
    await writer.start()
    tag = uuid.uuid4().hex[:6]
    issued: list[str] = []
    spies = pipe.spy(key) if profiled else {}
    cpu0 = pipe.cpu()
    try:
        started = time.perf_counter()
        i = 0
        while time.perf_counter() - started < seconds:
            open_calls = sum(1 for c in issued[-window * 2 :] if c not in pipe.watcher.ended)
            while open_calls < window:
                call_id = f"w-{tag}-{i}"
                await writer.propose(
                    call_id,
                    tool="propose_refund",
                    payment_id=f"pay_Z{i % BENCH_PAYMENTS:04d}",
                    amount_minor=1,
                    reason="bench",
                )
                issued.append(call_id)
                i += 1
                open_calls += 1
            await pipe.watcher.changed(0.05)
        elapsed = time.perf_counter() - started
        cpu1 = pipe.cpu()
        profiles = collect_spies(spies)
        spies = {}
        done = [pipe.watcher.ended[c] for c in issued if c in pipe.watcher.ended]
        ok = sum(1 for o in done if o.status == "succeeded")
        await pipe.watcher.wait(issued, timeout=60)
        statuses: dict[str, int] = {}
        for c in issued:
            o = pipe.watcher.ended.get(c)
            status = o.status if o else "open"
            statuses[status] = statuses.get(status, 0) + 1
        ms = [(o.at - o.proposed_at) * 1000 for o in done]
        hops = {} if profiled else await hop_latencies(pipe, set(issued))
        return (
            {
                **{f"{key}_{k}": ms for k, ms in hops.items()},
                key: ok / elapsed,
                f"{key}_statuses": statuses,
                f"{key}_p50": percentile(ms, 50),
                f"{key}_cpu_by_process": per_call_us(cpu0, cpu1, ok),
            }
            | ({"writes_approved": approved} if bot else {})
            | ({f"profile_{key}": profiles} if profiled else {})
        )
    finally:
        collect_spies(spies)
        if bot_task is not None:
            bot_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await bot_task
        await writer.stop()
        await consumer.stop()
        await producer.stop()


async def join_hop(
    pipe: Pipeline, rate: float, seconds: float, *, key: str = "join"
) -> dict[str, Any]:
    """The approval-join's own hops (issue 44) at ``rate`` (half the auto-approved capacity,
    whose writes the authorizer commits without the join): refunds that need a human,
    proposed in an open loop and each approved by a bot as soon as its request appears. Per
    call, from the broker's append times: `calls.authorized` → `approvals.requested` (the
    request's hop) and `approvals.decided` → `commands.committed` (the decision's hop)."""
    settings = pipe.run.settings
    signing = approval_keys(settings)
    approver = Actor(sub="bench-approver", tenant="tenant-a", roles=("approver",))
    tag = f"jh-{uuid.uuid4().hex[:6]}"
    consumer = kafka_consumer(
        settings,
        settings.topic(Topic.APPROVALS_REQUESTED),
        group=None,
        auto_offset_reset="latest",
    )
    producer = kafka_producer(settings, enable_idempotence=False)
    await consumer.start()
    await producer.start()
    if consumer.assignment():
        await consumer.seek_to_end()

    async def approve() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=100, max_records=1000)
            for records in batches.values():
                for r in records:
                    request = json.loads(r.value or b"")
                    if not str(request["call_id"]).startswith(tag):
                        continue
                    decision = sign_decision(
                        statement_for(
                            call_id=request["call_id"],
                            tenant=request["tenant"],
                            fingerprint=request["fingerprint"],
                            approver=approver,
                            verdict=ApprovalVerdict.APPROVE,
                            now=datetime.now(UTC),
                            validity=signing.decision_validity,
                        ),
                        signing,
                    )
                    await producer.send(
                        settings.topic(Topic.APPROVALS_DECIDED),
                        key=decision.call_id.encode(),
                        value=decision.to_bytes(),
                    )

    bot = asyncio.create_task(approve())
    writer = Proposer(settings, pipe.watcher, agent_token(settings, roles=("refund",), sub=tag))
    await writer.start()
    issued: list[str] = []
    try:
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            while len(issued) < int(elapsed * rate) + 1:
                n = len(issued)
                call_id = f"{tag}-{n}"
                await writer.propose(
                    call_id,
                    tool="propose_refund",
                    payment_id=f"pay_Z{n % BENCH_PAYMENTS:04d}",
                    amount_minor=1,
                    reason="bench",
                )
                issued.append(call_id)
            await asyncio.sleep(0.005)
        await writer.flush()
        finished = await pipe.watcher.wait(issued, timeout=60)
    finally:
        bot.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await bot
        await writer.stop()
        await consumer.stop()
        await producer.stop()
    topics = (Topic.AUTHORIZED, Topic.APPROVALS_REQUESTED, Topic.APPROVALS_DECIDED, Topic.COMMITTED)
    stamps = await _append_times(settings, topics, set(issued))
    request = _gaps(stamps[Topic.AUTHORIZED], stamps[Topic.APPROVALS_REQUESTED])
    decision = _gaps(stamps[Topic.APPROVALS_DECIDED], stamps[Topic.COMMITTED])
    return {
        f"{key}_hop_rate": rate,
        f"{key}_hop_calls": len(issued),
        f"{key}_hop_complete": finished,
        f"{key}_request_p50_ms": percentile(request, 50),
        f"{key}_request_p99_ms": percentile(request, 99),
        f"{key}_decision_p50_ms": percentile(decision, 50),
        f"{key}_decision_p99_ms": percentile(decision, 99),
        f"{key}_load_average": os.getloadavg()[0],
    }


def _gaps(first: dict[str, int], then: dict[str, int]) -> list[float]:
    return [float(then[c] - first[c]) for c in then if c in first]


async def _append_times(
    settings: Settings, topics: Sequence[Topic], call_ids: set[str]
) -> dict[Topic, dict[str, int]]:
    """Per topic, the broker's append time (ms) of each call's first record there."""
    stamps: dict[Topic, dict[str, int]] = {t: {} for t in topics}
    by_name = {settings.topic(t): t for t in topics}
    consumer = kafka_consumer(settings, *by_name, group=None, max_poll_records=5000)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=300, max_records=5000)
            for tp, records in batches.items():
                topic = by_name[tp.topic]
                for r in records:
                    try:
                        call_id = json.loads(r.value or b"").get("call_id")
                    except (ValueError, AttributeError):
                        continue
                    if call_id in call_ids and call_id not in stamps[topic]:
                        stamps[topic][call_id] = r.timestamp
            positions = [await consumer.position(tp) for tp in ends]
            if all(p >= ends[tp] for p, tp in zip(positions, ends, strict=True)):
                break
    finally:
        await consumer.stop()
    return stamps


async def idle_latency(pipe: Pipeline, calls: int, gap: float) -> dict[str, Any]:
    """One read call at a time on an otherwise idle pipeline, ``gap`` seconds apart (each
    call finds every stage waiting in its poll): the client's time from send to the
    outcome's arrival (as B2 lat: send → arrival after the last hop), and the p50 of each
    hop between the broker append times."""
    client_ms: list[float] = []
    call_ids: set[str] = set()
    tag = uuid.uuid4().hex[:6]
    for i in range(calls):
        await asyncio.sleep(gap)
        call_id = f"idle-{tag}-{i}"
        sample = await idle_bench.one_call(pipe.proposer, pipe.watcher, 30, call_id)
        if sample is None:
            continue
        client_ms.append(sample["client_ms"])
        call_ids.add(call_id)
    hops = await hop_latencies(pipe, call_ids)
    return {
        "idle_calls": len(client_ms),
        "idle_gap_s": gap,
        "idle_p50": percentile(client_ms, 50),
        "idle_p90": percentile(client_ms, 90),
        "idle_max": max(client_ms, default=float("nan")),
        **{f"idle_{k}": ms for k, ms in hops.items()},
    }


async def idle_short(pipe: Pipeline, idle_seconds: float) -> dict[str, Any]:
    await asyncio.sleep(idle_seconds)
    pids = [w.process.pid for w in pipe.workers.values()]
    _closed, note = idle_bench.reap_connections(pids)
    first = await idle_bench.one_call(pipe.proposer, pipe.watcher, timeout=60)
    second = await idle_bench.one_call(pipe.proposer, pipe.watcher, timeout=60)
    return {
        "t5_short_first_ms": first["outcome_ms"] if first else None,
        "t5_short_client_ms": first["client_ms"] if first else None,
        "t5_short_second_ms": second["outcome_ms"] if second else None,
        "t5_short_note": f"{idle_seconds:.0f} s idle, then {note}",
    }


# T6's reconciler settles a refund whose executor was killed after its effect_pending entry
# was committed (answered `unknown` first), as a deployment's does; quickly, for the bench.
T6_RECONCILER = {
    "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.5",
    "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS": "5",
    "RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT": "0",
}


def _provider_effects(provider_url: str) -> dict[str, int]:
    """The provider's applied effects by the key it was given (`GET /_stats`)."""
    with urllib.request.urlopen(f"{provider_url}/_stats", timeout=10) as response:
        stats = json.loads(response.read())
    return {str(k): int(v) for k, v in (stats.get("by_key") or {}).items()}


def _ledger_entries(database_url: str, tag: str) -> list[tuple[str, str]]:
    """(call id, idempotency key) of every ledger entry of calls or keys tagged ``tag``."""
    with pg_connect(database_url) as conn:
        rows = conn.execute(
            "SELECT call_id, idempotency_key FROM command_ledger WHERE tenant = 'tenant-a'"
            " AND (idempotency_key LIKE %(tag)s OR call_id LIKE %(tag)s)",
            {"tag": f"{tag}-%"},
        ).fetchall()
    return [(str(call_id), str(key)) for call_id, key in rows]


async def kill_one(
    pipe: Pipeline,
    rate: float,
    seconds: float,
    kill_at: float,
    *,
    write_rate: float = 20,
    retry_every: int = 4,
    retry_after: float = 1.0,
) -> dict[str, Any]:
    """Constant load of reads (``rate``) and auto-approved refunds (``write_rate``; every
    ``retry_every``-th proposed again ``retry_after`` seconds later by another call with the
    same idempotency key, as a retrying client does); SIGKILL one executor at ``kill_at``;
    recovery from the outcome times; what was done or answered twice
    (:mod:`bench.duplicates`) from the outcomes, the provider's effects and the ledger."""
    settings = pipe.run.settings
    victim = pipe.workers["executor1"]
    killed_at: list[float] = []
    tag = f"k-{uuid.uuid4().hex[:6]}"
    calls: dict[str, Call] = {}
    reconciler = pipe.run.start("reconciler", "t6-reconciler", **T6_RECONCILER)
    writer = Proposer(
        settings, pipe.watcher, agent_token(settings, roles=("refund_auto",), sub="bench-t6")
    )
    await writer.start()
    try:

        async def refund(call_id: str, n: int) -> None:
            calls[call_id] = Call(kind="write", key=f"{tag}-key{n}")
            await writer.propose(
                call_id,
                tool="propose_refund",
                idempotency_key=f"{tag}-key{n}",
                payment_id=f"pay_Z{n % BENCH_PAYMENTS:04d}",
                amount_minor=1,
                reason="bench t6",
            )

        retries: collections.deque[tuple[float, int]] = collections.deque()
        started = time.perf_counter()
        reads = writes = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            while reads < int(elapsed * rate) + 1:
                call_id = f"{tag}-r{reads}"
                calls[call_id] = Call(kind="read", key=call_id)
                await pipe.proposer.propose(
                    call_id, payment_id=f"pay_Z{reads % BENCH_PAYMENTS:04d}"
                )
                reads += 1
            while writes < int(elapsed * write_rate) + 1:
                await refund(f"{tag}-w{writes}", writes)
                if writes % retry_every == 0:
                    retries.append((elapsed + retry_after, writes))
                writes += 1
            while retries and retries[0][0] <= elapsed:
                _due, n = retries.popleft()
                await refund(f"{tag}-w{n}-again", n)
            if not killed_at and elapsed >= kill_at:
                killed_at.append(time.time())
                victim.kill()
            await asyncio.sleep(0.002)
        for _due, n in retries:  # the retries still due: sent now
            await refund(f"{tag}-w{n}-again", n)
        await pipe.proposer.flush()
        await writer.flush()
        # Every call final: a refund answered `unknown` waits for the reconciler.
        complete = await pipe.watcher.wait_settled(list(calls), timeout=120)
        effects = await asyncio.to_thread(_provider_effects, settings.provider_url)
        ledger = await asyncio.to_thread(_ledger_entries, settings.storage.database_url, tag)
    finally:
        await writer.stop()
        pipe.run.stop(reconciler)
    if not killed_at:
        raise RuntimeError("the executor was not killed")
    counted = count_duplicates(calls, pipe.watcher.answers, effects, ledger)
    t_kill = killed_at[0]
    ats = sorted(o.at for c in calls if (o := pipe.watcher.ended.get(c)) is not None)
    buckets: dict[int, int] = {}
    for at in ats:
        second = math.floor(at - t_kill)
        buckets[second] = buckets.get(second, 0) + 1
    # The rate before the kill, at most the offered load (a burst of outcomes catching up
    # before the kill is not the rate to recover to).
    offered = rate + write_rate * (1 + 1 / retry_every)
    pre = [buckets.get(s, 0) for s in range(-int(kill_at) + 3, 0)]
    pre_rate = min(statistics.mean(pre), offered) if pre else offered
    recovered = None
    for s in range(0, int(seconds)):
        window = [buckets.get(s + k, 0) for k in range(3)]
        if all(v >= 0.9 * pre_rate for v in window):
            recovered = s
            break
    repeated_outcomes = sum(1 for c in calls if pipe.watcher.terminal_counts.get(c, 0) > 1)
    return {
        "t6_rate": rate,
        "t6_write_rate": write_rate,
        "t6_pre_rate": pre_rate,
        "t6_recovered_s": recovered,
        "t6_complete": complete,
        "t6_calls": len(calls),
        "t6_finished": sum(1 for c in calls if pipe.watcher.settled(c)),
        "t6_duplicates": counted.as_dict(),
        "t6_repeated_outcomes": repeated_outcomes,
        "t6_buckets": [buckets.get(s, 0) for s in range(-5, 25)],
    }


async def profile(pipe: Pipeline, seconds: float, warmup: float) -> dict[str, Any]:
    """py-spy samples of every worker process under closed-loop read load (the load of T2)
    and under approved-write load, with each process's CPU per call meanwhile (to tell which
    one bounds it)."""
    spies = pipe.spy("reads")
    try:
        loop = await closed_loop(pipe, window=1000, seconds=seconds, warmup=warmup)
    finally:
        profiles = collect_spies(spies)
    writes = await approved_writes(pipe, seconds, 200, profiled=True)
    auto = await auto_writes(pipe, seconds, 200, profiled=True)
    return {
        "profile_auto_writes": auto.get("profile_auto_writes", {}),
        "profile_reads": profiles,
        "profile_reads_cpu_by_process": loop["e2e_cpu_by_process"],
        "profile_writes": writes.get("profile_writes", {}),
        "profile_writes_cpu_by_process": writes["writes_cpu_by_process"],
    }


async def rss_under_load(
    pipe: Pipeline, rate: float, seconds: float, first: float, interval: float
) -> dict[str, Any]:
    """Open-loop read load at ``rate`` for ``seconds``, sampling the resident memory of every
    worker process (and any child it started) every ``interval``: the peak per process, and
    its growth from the value at ``first`` seconds to the last sample."""
    samples: dict[str, list[tuple[float, float]]] = {}
    next_sample = [0.0]

    def sample(elapsed: float) -> None:
        if elapsed < next_sample[0]:
            return
        next_sample[0] = elapsed + interval
        for name, worker in pipe.workers.items():
            pid = worker.process.pid
            for label, p in [(name, pid)] + [(f"{name}/child{c}", c) for c in child_pids(pid)]:
                mb = rss_mb(p)
                if mb is not None:
                    samples.setdefault(label, []).append((elapsed, mb))

    tag = f"rss-{uuid.uuid4().hex[:6]}"
    issued = await open_loop(pipe, rate, seconds, tag=tag, during=sample)
    sample(seconds)
    complete = await pipe.watcher.wait(issued, timeout=60)
    per_process: dict[str, dict[str, float | None]] = {}
    for name, points in samples.items():
        at_first = next((mb for t, mb in points if t >= first), None)
        end = points[-1][1]
        per_process[name] = {
            "max_mb": max(mb for _t, mb in points),
            "first_mb": at_first,
            "end_mb": end,
            "growth": (end - at_first) / at_first if at_first else None,
        }
    return {
        "rss": per_process,
        "rss_rate": rate,
        "rss_seconds": seconds,
        "rss_first_s": first,
        "rss_calls": len(issued),
        "rss_ended": sum(1 for c in issued if c in pipe.watcher.ended),
        "rss_complete": complete,
    }


WAITING = "waiting in epoll (not CPU)"
CATEGORIES = (
    ("faust/", "faust + mode"),
    ("mode/", "faust + mode"),
    ("aiokafka/", "aiokafka"),
    ("kafka/", "aiokafka"),
    ("pydantic", "pydantic"),
    ("psycopg", "psycopg"),
    ("redis/", "redis-py"),
    ("jwt/", "token (PyJWT, cryptography)"),
    ("cryptography/", "token (PyJWT, cryptography)"),
    ("cedarpy", "Cedar"),
    ("opentelemetry", "telemetry (OpenTelemetry, prometheus_client)"),
    ("prometheus_client", "telemetry (OpenTelemetry, prometheus_client)"),
    ("asyncio/", "asyncio event loop"),
    # py-spy can count a thread blocked in epoll_wait as busy: waiting, not CPU.
    ("selectors.py", WAITING),
    ("json/", "json"),
    ("runtime/", "ratifier runtime loop"),
    ("telemetry/", "ratifier code"),
    ("streams/", "ratifier code"),
    ("executors/", "ratifier code"),
    ("commands/", "ratifier code"),
    ("schemas/", "ratifier code"),
    ("bench/", "bench harness"),
)
REPO = str(Path(__file__).resolve().parent.parent) + "/"


def top_frames(path: Path, n: int = 10) -> dict[str, list[tuple[str, float]]]:
    """From py-spy raw output: share of busy samples per library (by the innermost frame)
    and the top functions by own time; ``samples`` is how many there were."""
    if not path.exists():
        return {}
    own: dict[str, int] = {}
    by_category: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        total += count
        leaf = stack.split(";")[-1]
        name, _, where = leaf.partition(" (")
        module = where.split(":", 1)[0]
        category = next((c for marker, c in CATEGORIES if marker in module), "other")
        by_category[category] = by_category.get(category, 0) + count
        short = module.split("site-packages/")[-1].removeprefix(REPO)
        key = f"{name} ({short})"
        own[key] = own.get(key, 0) + count
    share = max(total, 1)
    return {
        "samples": [("busy samples", float(total)), ("rate per second", float(SPY_RATE))],
        "categories": sorted(
            ((k, c / share) for k, c in by_category.items()), key=lambda kv: -kv[1]
        ),
        "own": sorted(((k, c / share) for k, c in own.items()), key=lambda kv: -kv[1])[:n],
    }


async def whole_pipeline(report: Measurements, plan: Plan) -> None:
    run = BenchRun.create("pipeline")
    pipe: Pipeline | None = None
    try:
        seed_payments(run.settings.storage.database_url)

        async def start() -> dict[str, Any]:
            nonlocal pipe
            pipe = await start_pipeline(run, executors=2)
            return {"pipeline_processes": sorted(pipe.workers)}

        await report.step("pipeline start (streams + 2 executors + provider)", 240, start)
        if pipe is None:
            return
        p = pipe
        await report.step(
            "latency of one call on the idle pipeline",
            120,
            lambda: idle_latency(p, plan.idle_calls, plan.idle_gap),
        )
        await report.step(
            "T2 read calls, closed loop",
            120,
            lambda: closed_loop(p, 1000, plan.closed_seconds, plan.closed_warmup),
        )
        top = float(report.values.get("e2e_reads") or 100.0)
        await report.step(
            "T4 latency, open loop at 50 %", 120, lambda: latency(p, top / 2, plan.latency_seconds)
        )
        await report.step(
            "auto-approved writes (no human), closed loop",
            120,
            lambda: auto_writes(p, plan.writes_seconds, 200),
        )
        await report.step(
            "approved writes with a bot approver",
            120,
            lambda: approved_writes(p, plan.writes_seconds, 200),
        )
        auto = float(report.values.get("auto_writes") or 20.0)
        await report.step(
            "approval-join hop at half the auto-approved capacity (bot-approved, open loop)",
            120,
            lambda: join_hop(p, auto / 2, plan.writes_seconds),
        )
        # The same at half that rate: how much of the hop is the machine's load.
        await report.step(
            "approval-join hop at a quarter of the auto-approved capacity",
            120,
            lambda: join_hop(p, auto / 4, plan.writes_seconds, key="join_quarter"),
        )
        await report.step(
            "profiles (py-spy on every worker) under read and approved-write load",
            180,
            lambda: profile(p, plan.profile_seconds, plan.closed_warmup),
        )
        await report.step(
            "RSS per worker under load at 50 % of T2",
            plan.rss_seconds + 120,
            lambda: rss_under_load(p, top / 2, plan.rss_seconds, plan.rss_first, plan.rss_interval),
        )
        await report.step(
            "T5 short: idle + every connection reset",
            150,
            lambda: idle_short(p, plan.idle_seconds),
        )
        await report.step(
            "T6 kill one executor under reads and refunds (some retried)",
            240,
            lambda: kill_one(
                p, top * 0.5, plan.kill_seconds, plan.kill_at, write_rate=plan.kill_write_rate
            ),
        )
    finally:
        if pipe is not None:
            await pipe.proposer.stop()
            await pipe.watcher.stop()
        await run.close()


async def latency_settings() -> list[tuple[str, str, str, str]]:
    """The latency settings in force (producer linger, consumer fetch wait, poll), read from
    the code that builds the clients, for the baselines and the pipeline alike."""
    from bench.loop_identity import POLL_MS
    from bench.relay import BATCH as RELAY_BATCH
    from config.settings import Settings
    from runtime.loop import ConsumerLoop
    from streams.join_service import MAX_RECORDS as JOIN_RECORDS
    from streams.join_service import POLL_MS as JOIN_POLL_MS
    from streams.stateless import BATCH_MAX

    settings = Settings()
    loop_defaults = {
        name: param.default
        for name, param in inspect.signature(ConsumerLoop.__init__).parameters.items()
    }
    # A consumer as the pipeline builds it, never started: only its settings are read.
    probe = kafka_consumer(settings, group="latency-settings-probe")
    fetch_wait = getattr(probe, "_fetch_max_wait_ms", "?")
    fetch_min = getattr(probe, "_fetch_min_bytes", "?")
    await probe.stop()
    runtime = f"fetch_max_wait_ms={fetch_wait}, fetch_min_bytes={fetch_min}"
    return [
        (
            "B1 relay, B2 chain, B2r read chain (bench/relay.py)",
            f"linger_ms={LINGER_MS}",
            runtime,
            f"getmany 100 ms, ≤ {RELAY_BATCH} records",
        ),
        (
            "T1 loop identity (bench/loop_identity.py), validator, authorizer "
            "(streams/stateless.py on runtime/loop.py)",
            f"linger_ms={LINGER_MS}",
            runtime,
            f"getmany {POLL_MS} ms, ≤ {BATCH_MAX} records",
        ),
        (
            "executors (executors/service.py on runtime/loop.py)",
            f"linger_ms={LINGER_MS}",
            runtime,
            f"getmany {loop_defaults['poll_ms']} ms, ≤ {loop_defaults['max_records']} records "
            "(the loop's defaults, unless the service sets its own)",
        ),
        (
            "approval-join (streams/join_service.py on runtime/loop.py)",
            f"linger_ms={LINGER_MS}",
            runtime,
            f"getmany {JOIN_POLL_MS} ms, ≤ {JOIN_RECORDS} records (one transaction)",
        ),
        ("B2 latency probe's producer", f"linger_ms={LINGER_MS}", "—", "—"),
        ("bench load generator (bench/common.py Proposer)", "linger_ms=2", "—", "—"),
    ]


# --- the machine -----------------------------------------------------------------------------------


def _postgres_facts() -> str:
    try:
        with pg_connect(BenchRun.create("facts").settings.storage.database_url) as conn:
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('server_version', 'synchronous_commit', 'fsync', 'commit_delay', "
                "'shared_buffers', 'max_connections') ORDER BY name"
            ).fetchall()
    except psycopg.Error as exc:
        return f"? ({type(exc).__name__})"
    return ", ".join(f"{name}={setting}" for name, setting in rows)


def machine() -> list[tuple[str, str]]:
    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = "?"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    load = Path("/proc/loadavg").read_text().split()[:3]
    return [
        ("date", f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"),
        (
            "git commit",
            sh("git", "rev-parse", "--short", "HEAD")
            + (" (dirty)" if sh("git", "status", "--porcelain") else ""),
        ),
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("RAM", mem),
        ("kernel", platform.release()),
        ("Python", platform.python_version()),
        (
            "Kafka",
            f"{os.environ.get('RATIFIER_KAFKA_VERSION', '4.4.0')} (one node, KRaft, loopback)",
        ),
        (
            "PostgreSQL",
            _postgres_facts(),
        ),
        ("load average at the end", " ".join(load)),
    ]
