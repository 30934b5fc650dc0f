"""`make bench`: every baseline and every ratifier figure in one run, on the same broker,
topics shape and envelope size, written to bench/RESULTS.md with the targets' verdicts.

Each step prints one progress line, runs under its own time limit and, when it fails,
leaves its error in RESULTS.md instead of stopping the run. The whole run stays under
``BUDGET_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from psycopg.types.json import Jsonb
from redis.asyncio import Redis

from approvals.signing import approval_keys, sign_decision, statement_for
from bench import approval_state
from bench import idle as idle_bench
from bench import replies as replies_bench
from bench.common import (
    RESULTS,
    BenchRun,
    OutcomeWatcher,
    Proposer,
    agent_token,
    cpu_seconds,
    create_topics,
    drain,
    percentile,
    read_envelopes,
    reset_payments,
    table,
)
from commands.sql import named_query
from schemas.envelopes import Actor, ApprovalVerdict
from schemas.names import Topic

BUDGET_SECONDS = 19 * 60
HOPS = 4  # proposed → validated → authorized → committed → outcomes
BENCH_PAYMENTS = 256  # reads spread over this many payments (no single hot row)
COMMAND = "make bench  (= .venv/bin/python -m bench)"

log = logging.getLogger("bench")


@dataclass
class Report:
    started: float = field(default_factory=time.monotonic)
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def left(self) -> float:
        return BUDGET_SECONDS - (time.monotonic() - self.started)

    async def step(
        self, name: str, limit: float, action: Callable[[], Awaitable[dict[str, Any]]]
    ) -> None:
        limit = min(limit, self.left() - 30)
        clock = time.monotonic() - self.started
        if limit < 20:
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


def _short(v: Any) -> str:
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


# --- topics for the raw baselines ------------------------------------------------------------


# --- baselines ---------------------------------------------------------------------------------


async def baselines_kafka(n: int) -> dict[str, Any]:
    run = BenchRun.create("baselines")
    try:
        await run.prepare()
        p = run.settings.topic_prefix
        hops = [f"{p}hop{i}" for i in range(HOPS + 1)]
        faust_src, faust_dst = f"{p}faust.in", f"{p}faust.out"
        await create_topics(run, [*hops, faust_src, faust_dst])
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

        def identity() -> list[Any]:
            return [run.start_module("bench.faust_identity", "b3-faust", faust_src, faust_dst)]

        rate, cpu = await drain(run, identity, faust_src, faust_dst, n, envelopes, 300)
        out |= {"B3": rate, "B3_cpu_us": cpu}
        return out
    finally:
        await run.close()


async def chain_latency(rate: float, seconds: float) -> dict[str, Any]:
    """The latency floor of the design: a raw 4-hop aiokafka chain (same producer settings
    as the pipeline) at a low constant rate; time from send to arrival after the last hop."""
    from aiokafka import AIOKafkaConsumer

    run = BenchRun.create("chainlat")
    p = run.settings.topic_prefix
    hops = [f"{p}lat{i}" for i in range(HOPS + 1)]
    try:
        await create_topics(run, hops)
        for i in range(HOPS):
            run.start_module("bench.relay", f"lat-relay{i}", hops[i], hops[i + 1], f"{p}lat-{i}")
        consumer = AIOKafkaConsumer(
            hops[HOPS],
            bootstrap_servers=run.settings.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=run.settings.kafka_bootstrap, acks="all", linger_ms=2
        )
        await consumer.start()
        await producer.start()
        latencies: list[float] = []
        warm = True
        try:
            padding = b"x" * 800
            started = time.perf_counter()
            sent = 0
            # Warm-up until the relays' groups have joined and records flow.
            while warm and time.perf_counter() - started < 120:
                await producer.send_and_wait(hops[0], value=b"warm")
                batches = await consumer.getmany(timeout_ms=1000)
                warm = not any(batches.values())
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                due = int((time.perf_counter() - began) * rate) + 1
                while sent < due:
                    await producer.send(
                        hops[0], value=f"{time.time():.6f}|".encode() + padding, key=b"%d" % sent
                    )
                    sent += 1
                batches = await consumer.getmany(timeout_ms=5)
                now = time.time()
                for records in batches.values():
                    for r in records:
                        head = (r.value or b"").split(b"|", 1)[0]
                        if head not in (b"warm", b""):
                            latencies.append((now - float(head)) * 1000)
            end = time.perf_counter() + 10
            while len(latencies) < sent and time.perf_counter() < end:
                batches = await consumer.getmany(timeout_ms=100)
                now = time.time()
                for records in batches.values():
                    for r in records:
                        head = (r.value or b"").split(b"|", 1)[0]
                        if head not in (b"warm", b""):
                            latencies.append((now - float(head)) * 1000)
        finally:
            await consumer.stop()
            await producer.stop()
        return {
            "B2_lat_rate": rate,
            "B2_lat_p50": percentile(latencies, 50),
            "B2_lat_p99": percentile(latencies, 99),
            "B2_lat_p999": percentile(latencies, 99.9),
        }
    finally:
        await run.close()


async def baseline_redis(n: int) -> dict[str, Any]:
    run = BenchRun.create("redis")
    redis = Redis.from_url(run.settings.redis_url)
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
        url = BenchRun.create("pg").settings.database_url
        run_id = uuid.uuid4().hex[:8]
        with psycopg.connect(url) as conn:
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
    from schemas.identity import context_keys, verify_context_token
    from schemas.settings import Settings

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
    with psycopg.connect(database_url) as conn:
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
    """Each stage alone in its own worker draining the previous stage's output."""
    run = BenchRun.create("stages")
    out: dict[str, Any] = {}
    try:
        await run.prepare()
        t = run.settings.topic
        chain = [
            ("validator", Topic.PROPOSED, Topic.VALIDATED),
            ("authorizer", Topic.VALIDATED, Topic.AUTHORIZED),
            ("approval-join", Topic.AUTHORIZED, Topic.COMMITTED),
        ]
        values: list[bytes] | None = spread_envelopes(run, n)
        for stage, source, target in chain:

            def start(stage: str = stage) -> list[Any]:
                return [run.start("streams", f"stage-{stage}", RATIFIER_STREAMS_STAGES=stage)]

            rate, cpu = await drain(run, start, t(source), t(target), n, values, 300)
            out[f"stage_{stage}"] = rate
            out[f"stage_{stage}_cpu_us"] = cpu
            values = None

        def executor() -> list[Any]:
            return [run.start("executor", "stage-executor")]

        rate, cpu = await drain(run, executor, t(Topic.COMMITTED), t(Topic.OUTCOMES), n, None, 300)
        out |= {"stage_executor": rate, "stage_executor_cpu_us": cpu}
        return out
    finally:
        await run.close()


async def executor_drain(n: int, *, dedup: bool) -> tuple[float, float]:
    """Fresh committed read commands (spread over the bench payments) drained by one
    executor, with or without the Redis claim fast path."""
    from bench.executor import read_commands

    run = BenchRun.create("dedup" if dedup else "nodedup")
    try:
        await run.prepare()
        commands = [
            c.replace(b'"pay_A1001"', f'"pay_Z{i % BENCH_PAYMENTS:04d}"'.encode())
            for i, c in enumerate(read_commands(run.settings, n))
        ]
        t = run.settings.topic
        fast_path = "true" if dedup else "false"

        def executor() -> list[Any]:
            return [run.start("executor", "executor", RATIFIER_REDIS_FAST_PATH=fast_path)]

        return await drain(run, executor, t(Topic.COMMITTED), t(Topic.OUTCOMES), n, commands, 300)
    finally:
        await run.close()


async def executor_with_and_without_dedup(n: int) -> dict[str, Any]:
    """T3: the two variants in A-B-B-A order (the machine's load drifts; this cancels a
    linear drift), each figure the mean of its two drains."""
    first_without = await executor_drain(n, dedup=False)
    first_with = await executor_drain(n, dedup=True)
    second_with = await executor_drain(n, dedup=True)
    second_without = await executor_drain(n, dedup=False)
    return {
        "executor_nodedup": (first_without[0] + second_without[0]) / 2,
        "executor_nodedup_cpu_us": (first_without[1] + second_without[1]) / 2,
        "executor_dedup": (first_with[0] + second_with[0]) / 2,
        "executor_dedup_cpu_us": (first_with[1] + second_with[1]) / 2,
        "executor_drains": [first_without[0], first_with[0], second_with[0], second_without[0]],
    }


# --- the whole pipeline --------------------------------------------------------------------------


@dataclass
class Pipeline:
    run: BenchRun
    watcher: OutcomeWatcher
    proposer: Proposer
    workers: dict[str, Any]

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(w.process.pid) for name, w in self.workers.items()}


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
    cpu_us = {name: (cpu1[name] - cpu0[name]) / calls * 1e6 for name in cpu1}
    await pipe.watcher.wait(issued, timeout=60)  # let the tail drain before the next step
    return {
        "e2e_reads": rate,
        "e2e_cpu_streams_us": sum(v for k, v in cpu_us.items() if k.startswith("streams")),
        "e2e_cpu_executors_us": sum(v for k, v in cpu_us.items() if k.startswith("executor")),
        "e2e_window": window,
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
    ms = [
        (o.at - o.proposed_at) * 1000
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


HOP_TOPICS = (Topic.PROPOSED, Topic.VALIDATED, Topic.AUTHORIZED, Topic.COMMITTED, Topic.OUTCOMES)


async def hop_latencies(pipe: Pipeline, call_ids: set[str]) -> dict[str, Any]:
    """p50 of the time between consecutive topics (broker append times of each call's
    record), to see which stage the latency comes from."""
    from aiokafka import AIOKafkaConsumer

    settings = pipe.run.settings
    stamps: dict[Topic, dict[str, int]] = {t: {} for t in HOP_TOPICS}
    by_name = {settings.topic(t): t for t in HOP_TOPICS}
    consumer = AIOKafkaConsumer(
        *by_name,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
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
                    if call_id in call_ids and call_id not in stamps[topic]:
                        stamps[topic][call_id] = r.timestamp
            positions = [await consumer.position(tp) for tp in ends]
            if all(p >= ends[tp] for p, tp in zip(positions, ends, strict=True)):
                break
    finally:
        await consumer.stop()
    out: dict[str, Any] = {}
    for a, b in itertools.pairwise(HOP_TOPICS):
        gaps = [stamps[b][c] - stamps[a][c] for c in stamps[b] if c in stamps[a]]
        out[f"hop_{b.value}_p50_ms"] = percentile(gaps, 50)
        out[f"hop_{b.value}_p99_ms"] = percentile(gaps, 99)
    return out


async def approved_writes(pipe: Pipeline, seconds: float, window: int) -> dict[str, Any]:
    """Refunds of 1 minor unit, each approved by a bot as soon as its request appears."""
    from aiokafka import AIOKafkaConsumer

    settings = pipe.run.settings
    refund_token = agent_token(settings, roles=("refund",), sub="bench-refunder")
    # The approval service signs for the approver it authenticated (approvals.signing).
    signing = approval_keys(settings)
    approver = Actor(sub="bench-approver", tenant="tenant-a", roles=("approver",))
    consumer = AIOKafkaConsumer(
        settings.topic(Topic.APPROVALS_REQUESTED),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=2)
    await consumer.start()
    await producer.start()
    approved = 0

    async def bot() -> None:
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

    bot_task = asyncio.create_task(bot())
    writer = Proposer(settings, pipe.watcher, refund_token)
    await writer.start()
    tag = uuid.uuid4().hex[:6]
    issued: list[str] = []
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
        done = [pipe.watcher.ended[c] for c in issued if c in pipe.watcher.ended]
        ok = sum(1 for o in done if o.status == "succeeded")
        await pipe.watcher.wait(issued, timeout=60)
        statuses: dict[str, int] = {}
        for c in issued:
            o = pipe.watcher.ended.get(c)
            key = o.status if o else "open"
            statuses[key] = statuses.get(key, 0) + 1
        ms = [(o.at - o.proposed_at) * 1000 for o in done]
        return {
            "writes": ok / elapsed,
            "writes_statuses": statuses,
            "writes_p50": percentile(ms, 50),
            "writes_approved": approved,
        }
    finally:
        bot_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await bot_task
        await writer.stop()
        await consumer.stop()
        await producer.stop()


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


async def kill_one(pipe: Pipeline, rate: float, seconds: float, kill_at: float) -> dict[str, Any]:
    """Constant load; SIGKILL one executor at ``kill_at``; recovery from outcome times."""
    victim = pipe.workers["executor1"]
    killed_at: list[float] = []

    def maybe_kill(elapsed: float) -> None:
        if not killed_at and elapsed >= kill_at:
            killed_at.append(time.time())
            victim.kill()

    tag = f"k-{uuid.uuid4().hex[:6]}"
    issued = await open_loop(pipe, rate, seconds, tag=tag, during=maybe_kill)
    complete = await pipe.watcher.wait(issued, timeout=90)
    if not killed_at:
        raise RuntimeError("the executor was not killed")
    t_kill = killed_at[0]
    ats = sorted(o.at for c in issued if (o := pipe.watcher.ended.get(c)) is not None)
    buckets: dict[int, int] = {}
    for at in ats:
        second = math.floor(at - t_kill)
        buckets[second] = buckets.get(second, 0) + 1
    pre = [buckets.get(s, 0) for s in range(-int(kill_at) + 3, 0)]
    pre_rate = statistics.mean(pre) if pre else rate
    recovered = None
    for s in range(0, int(seconds)):
        window = [buckets.get(s + k, 0) for k in range(3)]
        if all(v >= 0.9 * pre_rate for v in window):
            recovered = s
            break
    # Duplicate effects: ledger entries and executed-audit rows per call of this run.
    with psycopg.connect(pipe.run.settings.database_url) as conn:
        ledger_dups = conn.execute(
            "SELECT count(*) FROM (SELECT call_id FROM command_ledger WHERE tenant = 'tenant-a'"
            " AND call_id LIKE %s GROUP BY tenant, idempotency_key HAVING count(*) > 1) d",
            (f"{tag}-%",),
        ).fetchone()
        audit_dups = conn.execute(
            "SELECT count(*) FROM (SELECT call_id FROM audit_log WHERE tenant = 'tenant-a'"
            " AND call_id LIKE %s AND kind = 'executed' GROUP BY call_id HAVING count(*) > 1) d",
            (f"{tag}-%",),
        ).fetchone()
        ledger_rows = conn.execute(
            "SELECT count(*) FROM command_ledger WHERE tenant = 'tenant-a' AND call_id LIKE %s",
            (f"{tag}-%",),
        ).fetchone()
    repeated_outcomes = sum(1 for c in issued if pipe.watcher.terminal_counts.get(c, 0) > 1)
    return {
        "t6_rate": rate,
        "t6_pre_rate": pre_rate,
        "t6_recovered_s": recovered,
        "t6_complete": complete,
        "t6_calls": len(issued),
        "t6_finished": sum(1 for c in issued if c in pipe.watcher.ended),
        "t6_ledger_rows": ledger_rows[0] if ledger_rows else None,
        "t6_dup_ledger": ledger_dups[0] if ledger_dups else None,
        "t6_dup_audit": audit_dups[0] if audit_dups else None,
        "t6_repeated_outcomes": repeated_outcomes,
        "t6_buckets": [buckets.get(s, 0) for s in range(-5, 25)],
    }


async def profile(pipe: Pipeline, seconds: int) -> dict[str, Any]:
    """py-spy samples of the streams worker and one executor under closed-loop load."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():  # noqa: ASYNC240 - one stat
        return {"profile": "py-spy not installed"}
    out_dir = pipe.run.log_dir
    procs = {}
    for name in ("streams", "executor0"):
        path = out_dir / f"profile-{name}.txt"
        procs[name] = (
            subprocess.Popen(  # noqa: ASYNC220 - runs beside the load, not awaited
                [
                    spy,
                    "record",
                    "--nonblocking",
                    "-r",
                    "50",
                    "-d",
                    str(seconds),
                    "-f",
                    "raw",
                    "-o",
                    str(path),
                    "-p",
                    str(pipe.workers[name].process.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            path,
        )
    await closed_loop(pipe, window=1000, seconds=seconds, warmup=1)
    tops = {}
    for name, (proc, path) in procs.items():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        tops[f"profile_{name}"] = top_frames(path)
    return tops


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
    ("asyncio/", "asyncio event loop"),
    ("json/", "json"),
    ("streams/", "ratifier code"),
    ("executors/", "ratifier code"),
    ("commands/", "ratifier code"),
    ("schemas/", "ratifier code"),
)


def top_frames(path: Path, n: int = 10) -> dict[str, list[tuple[str, float]]]:
    """From py-spy raw output: share of busy samples per library (by the innermost frame)
    and the top functions by own time."""
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
        short = module.split("site-packages/")[-1].split("/work/wt/bench/")[-1]
        key = f"{name} ({short})"
        own[key] = own.get(key, 0) + count
    share = max(total, 1)
    return {
        "categories": sorted(
            ((k, c / share) for k, c in by_category.items()), key=lambda kv: -kv[1]
        ),
        "own": sorted(((k, c / share) for k, c in own.items()), key=lambda kv: -kv[1])[:n],
    }


async def whole_pipeline(report: Report) -> None:
    run = BenchRun.create("pipeline")
    pipe: Pipeline | None = None
    try:
        seed_payments(run.settings.database_url)

        async def start() -> dict[str, Any]:
            nonlocal pipe
            pipe = await start_pipeline(run, executors=2)
            return {}

        await report.step("pipeline start (streams + 2 executors + provider)", 240, start)
        if pipe is None:
            return
        p = pipe
        await report.step("E2E read calls, closed loop", 120, lambda: closed_loop(p, 1000, 20, 5))
        top = float(report.values.get("e2e_reads") or 100.0)
        await report.step("T4 latency, open loop at 50 %", 120, lambda: latency(p, top / 2, 20))
        await report.step(
            "approved writes with a bot approver", 120, lambda: approved_writes(p, 15, 200)
        )
        await report.step("profile (py-spy) under closed-loop load", 90, lambda: profile(p, 12))
        await report.step("T5 short: idle + reaped connections", 150, lambda: idle_short(p, 30))
        await report.step(
            "T6 kill one executor under load", 180, lambda: kill_one(p, top * 0.5, 40, 12)
        )
    finally:
        if pipe is not None:
            await pipe.proposer.stop()
            await pipe.watcher.stop()
        await run.close()


# --- RESULTS.md ------------------------------------------------------------------------------------


def _postgres_facts() -> str:
    try:
        with psycopg.connect(BenchRun.create("facts").settings.database_url) as conn:
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


def render(report: Report, total_seconds: float) -> str:
    v = report.values
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
        f"Command: `{COMMAND}` — took {total_seconds / 60:.1f} min.",
        "",
        table(
            [tuple(row) for row in v["machine"]] if v.get("machine") else machine(),
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
            "(`RATIFIER_REDIS_FAST_PATH=false`, the ledger alone dedups)",
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
    if report.errors:
        lines += ["## Failed or skipped steps", ""]
        lines += [f"- {k}: `{e}`" for k, e in report.errors.items()]
        lines += [""]
    lines += [
        "## Step durations",
        "",
        table([[k, f"{s:.0f} s"] for k, s in report.timings.items()], ["step", "took"]),
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


async def main_async() -> int:
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    report = Report()
    n = int(os.environ.get("BENCH_N", "20000"))
    stage_n = int(os.environ.get("BENCH_STAGE_N", "4000"))
    print(
        f"bench: {COMMAND}; budget {BUDGET_SECONDS / 60:.0f} min; logs under test-artifacts/bench-logs",
        flush=True,
    )
    url = BenchRun.create("setup").settings.database_url
    await asyncio.to_thread(__import__("ratifier.migrate", fromlist=["migrate"]).migrate, url)
    await asyncio.to_thread(seed_payments, url)
    await report.step("pure stage costs", 120, lambda: pure_costs(5000))
    await report.step("B1 relay, B2 chain, B3 faust identity", 300, lambda: baselines_kafka(n))
    await report.step(
        "B2 latency floor (raw 4-hop chain, 50 records/s)", 120, lambda: chain_latency(50, 15)
    )
    await report.step("B4 Redis SET NX", 60, lambda: baseline_redis(5000))
    await report.step("B5 ledger transaction (psycopg)", 120, lambda: baseline_postgres(500))
    await report.step(
        "stages alone (validator, authorizer, approval-join, executor)",
        300,
        lambda: stages_alone(stage_n),
    )
    await report.step(
        "T3 executor without/with dedup (A-B-B-A)",
        300,
        lambda: executor_with_and_without_dedup(stage_n),
    )
    try:
        await asyncio.wait_for(whole_pipeline(report), timeout=max(report.left() - 20, 30))
    except Exception as exc:
        report.errors["whole pipeline"] = f"{type(exc).__name__}: {exc}"[:300]
    total = time.monotonic() - report.started
    # The machine as it was during the run: a later --render must not describe another one.
    report.values["machine"] = machine()
    VALUES.write_text(
        json.dumps(
            {
                "values": report.values,
                "errors": report.errors,
                "timings": report.timings,
                "total_seconds": total,
            },
            indent=1,
            default=str,
        ),
        encoding="utf-8",
    )
    RESULTS.write_text(render(report, total), encoding="utf-8")
    print(
        f"bench: wrote {RESULTS} in {total / 60:.1f} min; {len(report.errors)} step(s) failed",
        flush=True,
    )
    return 0 if not report.errors else 1


VALUES = Path(__file__).parent / "results.json"


def rerender() -> int:
    """Write RESULTS.md again from the last run's bench/results.json (e.g. after
    `make bench-idle` finished, to include its result)."""
    saved = json.loads(VALUES.read_text(encoding="utf-8"))
    report = Report(values=saved["values"], errors=saved["errors"], timings=saved["timings"])
    RESULTS.write_text(render(report, saved["total_seconds"]), encoding="utf-8")
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
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
