"""`make soak`: the pipeline (two streams workers, two executors, a reconciler) at half its
measured capacity for ten minutes, with duplicate idempotency keys, approvals and invalid
calls, while an executor and a streams worker are killed and restarted every two minutes.

Checked at the end: every call has exactly one final outcome (repeats of the same outcome are
allowed, two different ones are not), every read and duplicate succeeded, every invalid call
was rejected, every approved refund succeeded; the provider's effects equal the ledger's
succeeded operations, none applied twice; the resident memory of every process that was not
restarted, and of the children they run their work in, does not keep growing after the
warm-up (tests/soak/memory.py: sampled every 2 s, the warm-up a share of the run, one slope
fitted between the kills under 10 % per 5 minutes of load, and too few samples to judge is a
failure). The figures go to test-artifacts/soak.json (with every memory sample) and are
printed for docs/reliability.md. RATIFIER_SOAK_SECONDS shortens the run (default 600; the
memory check needs at least ``shortest_soak()``, 100 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.names import Topic
from tests.e2e.approvals_kit import decide, token
from tests.e2e.conftest import ARTIFACTS, Pipeline, SigningKeys, start_pipeline
from tests.e2e.executor_kit import PAYMENTS, provider_stats, seed_payments
from tests.services import context_token, keyed_call, where_calls_are
from tests.soak.memory import (
    SAMPLE_EVERY,
    judge_memory,
    restart_every,
    settle_seconds,
    shortest_soak,
    warmup_seconds,
)

pytestmark = pytest.mark.soak

SOAK_SECONDS = int(os.environ.get("RATIFIER_SOAK_SECONDS", "600"))
RESTART_EVERY = restart_every(SOAK_SECONDS)
# Memory is judged from the end of the warm-up (seconds of load): once an executor and a
# streams worker have each been restarted once, and their peers have taken over.
WARMUP_SECONDS = warmup_seconds(SOAK_SECONDS)
SETTLE_SECONDS = 240
FINAL = {"succeeded", "failed", "rejected", "denied", "conflict", "expired", "cancelled"}
RECONCILER = {
    "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.5",
    "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS": "5",
}


@dataclass
class Call:
    kind: str  # read, duplicate, invalid, refund
    key: str
    expect: str


@dataclass
class Ledger:
    """What the soak sent and what came back, by call id."""

    calls: dict[str, Call] = field(default_factory=dict)
    finals: dict[str, set[str]] = field(default_factory=dict)
    # Each call's final outcome records (status/stage/code), for the diagnosis of a failure.
    answers: dict[str, list[str]] = field(default_factory=dict)
    decided: set[str] = field(default_factory=set)
    reads: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def open_calls(self) -> list[str]:
        return [c for c in self.calls if not self.finals.get(c)]


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (`ratifier streams` runs `stages` and `approval-join`)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return []
    return found


def _role(pid: int) -> str:
    """A child's command (`python -m ratifier.cli stages` → stages), else its pid."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [a.decode(errors="replace") for a in args if a]
    return words[-1] if words else str(pid)


# The child processes a worker runs its work in, by the worker's command: their memory is
# the work's (the parent only supervises them).
CHILDREN = {"streams": ("stages", "approval-join")}


class Soak:
    def __init__(self, pipeline: Pipeline, run_id: str) -> None:
        self.pipeline = pipeline
        self.settings = pipeline.settings
        self.run_id = run_id
        self.ledger = Ledger()
        self.rng = random.Random(run_id)
        self.reader_ctx = context_token(self.settings)
        self.refund_ctx = token(self.settings, "agent-1", roles=("refund",))
        self.approver = token(self.settings, "soak-approver")
        # VmRSS (KiB) of each process, by the monotonic time of the sample.
        self.rss: dict[str, list[tuple[float, int]]] = {}
        self.load_started: float | None = None
        self.kills: list[float] = []  # when each restart's kill began (monotonic)
        self.restarts: Counter[str] = Counter()
        self.stop_reading = asyncio.Event()

    def next_call(self, n: int) -> tuple[str, bytes]:
        call_id = f"soak-{self.run_id}-{n}"
        roll = self.rng.random()
        if roll < 0.1 and self.ledger.reads:  # a retry: same key, same arguments
            key, arguments = self.rng.choice(self.ledger.reads)
            self.ledger.calls[call_id] = Call(kind="duplicate", key=key, expect="succeeded")
            return call_id, keyed_call(call_id, "get_payment", arguments, key, self.reader_ctx)
        if roll < 0.2:
            arguments = {"payment_id": "pay_A1001", "tenant_id": "tenant-b"}
            self.ledger.calls[call_id] = Call(kind="invalid", key=call_id, expect="rejected")
            return call_id, keyed_call(call_id, "get_payment", arguments, call_id, self.reader_ctx)
        if roll < 0.3:
            key = f"soak-{self.run_id}-refund-{n}"
            arguments = {
                "payment_id": self.rng.choice(PAYMENTS),
                "amount_minor": 1,
                "reason": "soak",
            }
            self.ledger.calls[call_id] = Call(kind="refund", key=key, expect="succeeded")
            return call_id, keyed_call(call_id, "propose_refund", arguments, key, self.refund_ctx)
        arguments = {"payment_id": "pay_A1001"}
        self.ledger.reads.append((call_id, arguments))
        self.ledger.calls[call_id] = Call(kind="read", key=call_id, expect="succeeded")
        return call_id, keyed_call(call_id, "get_payment", arguments, call_id, self.reader_ctx)

    async def read_answers(self) -> None:
        consumer = AIOKafkaConsumer(
            self.settings.topic(Topic.OUTCOMES),
            self.settings.topic(Topic.APPROVALS_REQUESTED),
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        requests = self.settings.topic(Topic.APPROVALS_REQUESTED)
        try:
            while not self.stop_reading.is_set():
                batches = await consumer.getmany(timeout_ms=300, max_records=2000)
                for tp, records in batches.items():
                    for record in records:
                        body = json.loads(record.value)
                        call_id = body.get("call_id")
                        if call_id not in self.ledger.calls:
                            continue
                        if tp.topic == requests:
                            if call_id not in self.ledger.decided:
                                self.ledger.decided.add(call_id)
                                await asyncio.to_thread(decide, self.pipeline, body, self.approver)
                        elif body["status"] in FINAL:
                            self.ledger.finals.setdefault(call_id, set()).add(body["status"])
                            error = body.get("error") or {}
                            self.ledger.answers.setdefault(call_id, []).append(
                                f"{body['status']}/{body.get('stage')}/{error.get('code')}"
                                f"@{record.partition}:{record.offset}"
                            )
        finally:
            await consumer.stop()

    async def sample_rss(self) -> None:
        """VmRSS of every worker process and of each child it runs (``name/role``)."""
        while not self.stop_reading.is_set():
            for worker in self.pipeline.workers:
                pid = worker.process.pid
                for label, p in [
                    (worker.name, pid),
                    *((f"{worker.name}/{_role(c)}", c) for c in _children(pid)),
                ]:
                    rss = _rss_kib(p)
                    if rss is not None:
                        self.rss.setdefault(label, []).append((time.monotonic(), rss))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_reading.wait(), SAMPLE_EVERY)

    def rss_of_load(self) -> dict[str, list[tuple[float, int]]]:
        """Each process's samples by seconds since the load started (negative before)."""
        zero = self.load_started if self.load_started is not None else 0.0
        return {n: [(t - zero, kib) for t, kib in s] for n, s in self.rss.items()}

    def kills_of_load(self) -> list[float]:
        """When each kill began, in seconds since the load started."""
        zero = self.load_started if self.load_started is not None else 0.0
        return [t - zero for t in self.kills]

    async def restart(self, name: str, command: str, **env: str) -> None:
        worker = self.pipeline.worker(name)
        self.kills.append(time.monotonic())
        await asyncio.to_thread(worker.kill)
        self.pipeline.workers.remove(worker)
        for label in [n for n in self.rss if n.split("/")[0] == name]:
            del self.rss[label]  # a new process: its memory is measured from its start
        self.pipeline.start(command, name, **env)
        self.restarts[name] += 1

    async def measure_capacity(self, producer: AIOKafkaProducer, n: int = 1000) -> float:
        started = time.monotonic()
        ids = []
        for i in range(n):
            call_id, value = self.next_call(-1 - i)
            ids.append(call_id)
            await producer.send(
                self.settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
            )
        await producer.flush()

        def unanswered() -> list[str]:
            return [
                c
                for c in ids
                if self.ledger.calls[c].kind != "refund" and not self.ledger.finals.get(c)
            ]

        while unanswered():
            await asyncio.sleep(0.2)
            if time.monotonic() - started > 120:
                missing = unanswered()
                raise AssertionError(
                    f"capacity probe: {len(missing)} of {n} calls got no final outcome in 120 s, "
                    f"e.g. {missing[:5]}"
                )
        return n / (time.monotonic() - started)

    async def run(self) -> dict[str, Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap, acks="all", linger_ms=5
        )
        await producer.start()
        reader = asyncio.create_task(self.read_answers())
        sampler = asyncio.create_task(self.sample_rss())
        try:
            capacity = await self.measure_capacity(producer)
            rate = capacity / 2
            started = self.load_started = time.monotonic()
            next_restart, restart_streams, n = started + RESTART_EVERY, False, 0
            while (now := time.monotonic()) - started < SOAK_SECONDS:
                due = int((now - started) * rate) - n
                for _ in range(max(due, 0)):
                    call_id, value = self.next_call(n)
                    n += 1
                    await producer.send(
                        self.settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
                    )
                if now >= next_restart:
                    if restart_streams:
                        await self.restart("streams", "streams", RATIFIER_STREAMS__HTTP_PORT="0")
                    else:
                        await self.restart("executor", "executor")
                    restart_streams = not restart_streams
                    next_restart += RESTART_EVERY
                await asyncio.sleep(0.05)
            await producer.flush()
            sent_seconds = time.monotonic() - started
            deadline = time.monotonic() + SETTLE_SECONDS
            while self.ledger.open_calls() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.5)
            return {
                "capacity_calls_per_s": round(capacity, 1),
                "rate_calls_per_s": round(rate, 1),
                "calls": n,
                "seconds": round(sent_seconds, 1),
            }
        finally:
            self.stop_reading.set()
            await asyncio.gather(reader, sampler, return_exceptions=True)
            await producer.stop()


def _succeeded_operations(pipeline: Pipeline, run_id: str) -> set[str]:
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT operation_id FROM command_ledger "
            "WHERE tenant = 'tenant-a' AND idempotency_key LIKE %s AND status = 'succeeded'",
            (f"soak-{run_id}-refund-%",),
        ).fetchall()
    return {row[0] for row in rows}


@pytest.mark.timeout(SOAK_SECONDS + SETTLE_SECONDS + 900)
def test_soak(signing_keys: SigningKeys) -> None:
    if shortest_soak() > SOAK_SECONDS:
        pytest.fail(
            f"RATIFIER_SOAK_SECONDS={SOAK_SECONDS} leaves no memory to judge after the "
            f"warm-up ({WARMUP_SECONDS:.0f} s): at least {shortest_soak()}"
        )
    run_id = uuid.uuid4().hex[:6]
    # Approval states are kept until the request's expiry + clock skew + retention margin
    # (docs/approvals.md); 45 s + 30 s + 15 s keeps the join's table in its steady state
    # before the warm-up ends, so that memory growth after it means a leak, not retention.
    pipeline = start_pipeline(
        signing_keys,
        "soak",
        executors=2,
        approval_ttl=45,
        RATIFIER_APPROVALS__RETENTION_MARGIN_SECONDS="15",
    )
    try:
        seed_payments(pipeline.settings)
        pipeline.start("streams", "streams-2", RATIFIER_STREAMS__HTTP_PORT="0")
        # A refund whose executor is killed after its effect_pending entry is committed is
        # answered `unknown`; only reconciliation gives it its final outcome, as in production.
        pipeline.start("reconciler", "reconciler", **RECONCILER)
        soak = Soak(pipeline, run_id)
        figures = asyncio.run(soak.run())
        ledger = soak.ledger
        lost = ledger.open_calls()
        twice = {c: s for c, s in ledger.finals.items() if len(s) > 1}
        wrong = {
            c: (call.kind, sorted(ledger.finals.get(c, set())))
            for c, call in ledger.calls.items()
            if ledger.finals.get(c) and ledger.finals[c] != {call.expect}
        }
        stats = provider_stats(pipeline.provider_url)
        mine = {k: v for k, v in stats["by_key"].items() if f"soak-{run_id}-refund-" in k}
        applied_twice = {k: v for k, v in mine.items() if v > 1}
        ledger_succeeded = _succeeded_operations(pipeline, run_id)
        examples = {
            "lost": {
                c: where
                for c, where in asyncio.run(
                    where_calls_are(pipeline.settings, set(lost[:5]))
                ).items()
            },
            "two_final_outcomes": {c: ledger.answers.get(c) for c in list(twice)[:10]},
            "unexpected": {
                c: (ledger.calls[c].kind, ledger.answers.get(c)) for c in list(wrong)[:10]
            },
        }
        # Processes not restarted, and the children they run their work in (each must have
        # been sampled). The fake provider is left out: it is a test double that keeps every
        # operation it saw (the effects = ledger check above reads them).
        workers = {w.name for w in pipeline.workers if not soak.restarts.get(w.name)}
        workers -= {"provider"}
        rss = soak.rss_of_load()
        steady = {label for label in rss if label.split("/")[0] in workers} | workers
        steady |= {
            f"{name}/{child}"
            for name in workers
            for command, children in CHILDREN.items()
            if name.split("-")[0] == command
            for child in children
        }
        kills = soak.kills_of_load()
        growths, memory_problems = judge_memory(
            rss,
            steady,
            start=WARMUP_SECONDS,
            end=float(SOAK_SECONDS),
            kills=kills,
            settle=settle_seconds(SOAK_SECONDS),
        )
        figures.update(
            kinds=dict(Counter(c.kind for c in ledger.calls.values())),
            lost=len(lost),
            two_final_outcomes=len(twice),
            unexpected=len(wrong),
            provider_effects=sum(mine.values()),
            ledger_succeeded=len(ledger_succeeded),
            applied_twice=len(applied_twice),
            restarts=dict(soak.restarts),
            rss_growth_percent={n: round(g.growth_percent, 1) for n, g in growths.items()},
            rss_projected_percent={n: round(g.projected_percent, 1) for n, g in growths.items()},
            rss_samples_judged={n: g.samples for n, g in growths.items()},
            rss_slope_kib_per_s={n: round(g.slope_kib_per_s, 1) for n, g in growths.items()},
            kills_at=[round(k, 1) for k in kills],
            rss_last_mib={n: round(s[-1][1] / 1024) for n, s in soak.rss.items() if s},
            memory_problems=memory_problems,
            warmup_seconds=WARMUP_SECONDS,
            settle_seconds=settle_seconds(SOAK_SECONDS),
            examples=examples,
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        # soak.json also keeps every sample (seconds of load, MiB), to tell a plateau, a
        # step at a kill and a leak apart; the printed figures do without them.
        series = {n: [(round(t, 1), round(kib / 1024, 1)) for t, kib in s] for n, s in rss.items()}
        (ARTIFACTS / "soak.json").write_text(
            json.dumps({**figures, "rss_series_mib": series}, indent=2) + "\n"
        )
        print("soak:", json.dumps(figures))
        assert not lost, f"{len(lost)} calls without a final outcome, e.g. {lost[:5]}"
        assert not twice, f"two different final outcomes: {list(twice.items())[:5]}"
        assert not wrong, f"unexpected outcomes: {list(wrong.items())[:5]}"
        assert not applied_twice, f"applied twice at the provider: {applied_twice}"
        assert set(mine) == ledger_succeeded, "provider effects differ from the ledger"
        assert not memory_problems, f"memory: {memory_problems}"
        assert pipeline.alive()
    finally:
        pipeline.stop()
