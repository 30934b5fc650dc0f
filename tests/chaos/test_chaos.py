"""`make chaos`: the repeatable chaos suite (issue 17, point 6).

An isolated set of services — a private single-node Kafka, a private redis-server, a private
PostgreSQL cluster, each on free ports and temporary folders (the developer's 9092 / 6379 /
5432 are never touched) — carries the whole pipeline: a streams worker, two executors, the
reconciler and the fake provider. Each experiment runs a steady mixed load (reads, duplicate
idempotency keys, invalid calls carrying an injected `tenant_id`, reads of another tenant's
payment, refunds approved through `approvals_kit.decide` a few seconds after their request,
retried refunds sharing a key) and injects one fault a third of the way in:

  executor_kill9    kill -9 of an executor (restarted at once, as a supervisor would)
  streams_kill9     kill -9 of the streams worker with approvals pending (restarted at once)
  broker_kill9      kill -9 of the broker, restarted after 20 s
  redis_restart     the private redis-server stopped and started again
  redis_flushall    FLUSHALL on the private Redis
  postgres_stop     the private PostgreSQL stopped for 20 s
  provider_faults   provider 503s, dropped answers after the effect, then 8 s hangs for 15 s
  poison            non-JSON, 900 KB, wrong-version and key-less records on every consumed topic

After each, the history checker (tests/e2e/history.py) and the bookkeeping here verify: no
lost call (every call the broker acknowledged has a final outcome; `unknown` only
provisionally, then settled), no duplicate effect at the provider, provider effects = the
ledger's succeeded operations, no call with two different final outcomes, every acknowledged
call's final outcome the one its kind must get (tests/chaos/expectations.py: a read succeeds,
an injected `tenant_id` is rejected `invalid_arguments`, another tenant's payment is denied
`not_found`, a refund succeeds or ends in a named "not now" refusal), and at least a minimum
of acknowledged calls (in all and of each kind) and of provider effects for the load planned,
so that a run that sends, or applies, nothing fails (calls the broker never acknowledged are
counted, `unsent`, not dropped). Measured: the recovery time (from the fault's end until every
call in flight at that moment has its final outcome) and the maximum latency (sending to final
outcome, approval wait included). The table goes to test-artifacts/chaos.json and is printed.

RATIFIER_CHAOS_ONLY=name[,name] selects experiments; RATIFIER_CHAOS_SECONDS sets the load per
experiment (default 75; the minimums scale with it); RATIFIER_CHAOS_RATE the calls per second
(default 12). One experiment, quickly (1-2 minutes; what `make mutants` runs per break):

    RATIFIER_CHAOS_ONLY=executor_kill9 RATIFIER_CHAOS_SECONDS=30 make chaos
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import redis
from aiokafka.errors import KafkaError

from config.settings import Settings
from ratifier.migrate import migrate
from ratifier.processes import FAKE_PROVIDER_MODULE, start_worker_args
from ratifier.topics import ensure_topics
from runtime.clients import kafka_consumer, kafka_producer
from schemas.names import Topic
from tests.chaos import expectations
from tests.e2e.approvals_kit import decide, token
from tests.e2e.conftest import ARTIFACTS, Pipeline, SigningKeys, free_port, wait_http
from tests.e2e.executor_kit import PAYMENTS, provider_stats, seed_payments
from tests.e2e.history import SETTLED, History
from tests.e2e.private_services import (
    PrivateKafka,
    PrivatePostgres,
    PrivateRedis,
    kafka_jars,
    private_kafka,
    private_postgres,
    private_redis,
    redis_server_binary,
    required,
    server_binaries,
)
from tests.e2e.test_reconciliation import faults
from tests.services import PIPELINE_INPUTS, commit_lag, context_token, keyed_call, run, worker_env

pytestmark = pytest.mark.chaos

LOAD_SECONDS = int(os.environ.get("RATIFIER_CHAOS_SECONDS", "75"))
RATE = float(os.environ.get("RATIFIER_CHAOS_RATE", "12"))
ONLY = {n for n in os.environ.get("RATIFIER_CHAOS_ONLY", "").split(",") if n}
SETTLE_SECONDS = 240
# After the load, how long its last sends may still wait for the broker's acknowledgement
# (a send waits at most its 60 s request timeout for buffer room, then for its answer).
SEND_WAIT_SECONDS = 150
FOREIGN_PAYMENT = "pay_B2001"  # tenant-b's (commands/payments/migrations/0002_seed.sql)
OUTAGE_SECONDS = 20
APPROVAL_DELAY = 3.0  # approvals stay pending this long, so a crash always finds some
# What the streams worker consumes in its group (its committed offsets are checked).
# Experiments whose fault makes the provider refuse refunds before their effect: there a
# refund may also end failed / retry_exhausted (tests/chaos/expectations.py).
PROVIDER_FAILS = frozenset({"provider_faults"})
RECONCILER = {
    "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.5",
    "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS": "5",
    "RATIFIER_RECONCILER__ATTEMPTS": "1000",
}


@dataclass
class Call:
    kind: str  # expectations.KINDS: read, duplicate, invalid, foreign, refund, refund_retry
    key: str
    sent_at: float = 0.0
    sent: bool = False


@dataclass
class Answers:
    """Everything read back from the private cluster, for the whole suite, by call id."""

    outcomes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    final_at: dict[str, float] = field(default_factory=dict)
    dead_letters: Counter[str] = field(default_factory=Counter)
    approval_requests: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Services:
    kafka: PrivateKafka
    redis: PrivateRedis
    postgres: PrivatePostgres
    pipeline: Pipeline


@contextmanager
def isolated_services(keys: SigningKeys) -> Iterator[Services]:
    """Private Kafka, Redis and PostgreSQL, migrated, with the pipeline on them; everything
    stopped and removed on the way out, also on failure."""
    with ExitStack() as stack:
        kafka = stack.enter_context(private_kafka())
        cache = stack.enter_context(private_redis())
        postgres = stack.enter_context(private_postgres())
        migrate(postgres.url)
        provider_port = free_port()
        settings = Settings(
            topic_prefix=f"chaos{uuid.uuid4().hex[:6]}.",
            topic_partitions=4,
            kafka={"bootstrap": kafka.bootstrap},
            storage={"redis_url": cache.url, "database_url": postgres.url},
            context={"jwks_file": str(keys.jwks_path)},
            approvals={"ttl_seconds": 600},
            provider_url=f"http://127.0.0.1:{provider_port}",
            development_mode=True,
        )
        seed_payments(settings)
        run(ensure_topics(settings))
        pipeline = Pipeline(
            settings=settings,
            workers=[],
            env={
                **worker_env(settings),
                "RATIFIER_CONTEXT__JWKS_FILE": str(keys.jwks_path),
                "RATIFIER_APPROVALS__TTL_SECONDS": str(settings.approvals.ttl_seconds),
                "RATIFIER_PROVIDER_URL": settings.provider_url,
                "RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS": "10",
                "RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT": "0",
                "RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT": "0",
                "RATIFIER_OBSERVABILITY__AUDIT_METRICS_PORT": "0",
                "RATIFIER_STREAMS__HTTP_PORT": "0",
            },
            log_dir=ARTIFACTS / "chaos-logs",
            provider_url=settings.provider_url,
        )
        stack.callback(pipeline.stop)
        provider = start_worker_args(
            ["--port", str(provider_port)],
            name="provider",
            log_dir=pipeline.log_dir,
            env=pipeline.env,
            module=FAKE_PROVIDER_MODULE,
        )
        pipeline.workers.append(provider)
        wait_http(settings.provider_url + "/_stats", provider)
        pipeline.start("streams", "streams")
        pipeline.start("executor", "executor")
        pipeline.start("executor", "executor-2")
        pipeline.start("reconciler", "reconciler", **RECONCILER)
        pipeline.wait_ready(timeout=180)
        yield Services(kafka=kafka, redis=cache, postgres=postgres, pipeline=pipeline)


class MixedLoad:
    """The load, the answers and the history check, on one event loop, for any pipeline (the
    partition suite, tests/partitions, runs it on its multi-host cluster)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.settings = pipeline.settings
        self.answers = Answers()
        self.reader_ctx = context_token(self.settings)
        self.refund_ctx = token(self.settings, "agent-1", roles=("refund",))
        self.approver = token(self.settings, "chaos-approver")
        self.pending_decisions: list[tuple[float, dict[str, Any]]] = []
        self.decided: set[str] = set()
        self.calls: dict[str, Call] = {}
        self.pending_at_fault = 0  # approvals pending when the streams worker was killed
        self.provider_fails = PROVIDER_FAILS
        self.poison_sent = self.poison_refused = 0

    # --- reading answers and deciding approvals -------------------------------------------

    async def read_answers(self, stop: asyncio.Event) -> None:
        names = {
            self.settings.topic(Topic.OUTCOMES): Topic.OUTCOMES,
            self.settings.topic(Topic.APPROVALS_REQUESTED): Topic.APPROVALS_REQUESTED,
            self.settings.topic(Topic.DEADLETTER): Topic.DEADLETTER,
        }
        consumer = kafka_consumer(self.settings, *names, group=None)
        await consumer.start()
        try:
            while not stop.is_set():
                try:
                    batches = await consumer.getmany(timeout_ms=300, max_records=2000)
                except KafkaError:
                    await asyncio.sleep(0.5)  # the broker is away: keep our position
                    continue
                now = time.monotonic()
                for tp, records in batches.items():
                    for record in records:
                        self._note(names[tp.topic], record.value, now)
        finally:
            await consumer.stop()

    def _note(self, topic: Topic, value: bytes | None, now: float) -> None:
        try:
            body = json.loads(value or b"")
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        call_id = body.get("call_id")
        if topic is Topic.DEADLETTER:
            self.answers.dead_letters[str(call_id)] += 1
            return
        if call_id not in self.calls:
            return
        if topic is Topic.APPROVALS_REQUESTED:
            if call_id not in self.decided:
                self.decided.add(call_id)
                self.pending_decisions.append((now + APPROVAL_DELAY, body))
            return
        self.answers.outcomes.setdefault(call_id, []).append(body)
        if body.get("status") in SETTLED and call_id not in self.answers.final_at:
            self.answers.final_at[call_id] = now

    async def decide_approvals(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            due = [d for d in self.pending_decisions if d[0] <= now]
            for item in due:
                try:
                    await asyncio.to_thread(decide, self.pipeline, item[1], self.approver)
                except (KafkaError, OSError):
                    continue  # the broker is away: decided again on the next round
                self.pending_decisions.remove(item)
            await asyncio.sleep(0.2)

    # --- load -------------------------------------------------------------------------------

    def next_call(self, exp: str, n: int, rng: random.Random) -> tuple[str, bytes]:
        """The n-th call of experiment ``exp`` (the shares: expectations.SHARES)."""
        call_id = f"chaos-{exp}-{n}"
        roll = rng.random()
        mine = [c for c in self.calls.values() if c.key.startswith(f"chaos-{exp}-")]
        reads = [c for c in mine if c.kind == "read"]
        refunds = [c for c in mine if c.kind == "refund"]
        if roll < 0.1 and reads:  # an agent's retry: same key, same arguments
            key = rng.choice(reads).key
            self.calls[call_id] = Call(kind="duplicate", key=key)
            arguments = {"payment_id": "pay_A1001"}
            return call_id, keyed_call(call_id, "get_payment", arguments, key, self.reader_ctx)
        if roll < 0.2:  # a prompt injection: the other tenant named in the arguments
            arguments = {"payment_id": "pay_A1001", "tenant_id": "tenant-b"}
            self.calls[call_id] = Call(kind="invalid", key=call_id)
            return call_id, keyed_call(call_id, "get_payment", arguments, call_id, self.reader_ctx)
        if roll < 0.25 and refunds:  # a refund retried with its key and arguments
            key = rng.choice(refunds).key
            self.calls[call_id] = Call(kind="refund_retry", key=key)
            return call_id, keyed_call(
                call_id, "propose_refund", self._refund_args(key), key, self.refund_ctx
            )
        if roll < 0.4:
            key = f"chaos-{exp}-refund-{n}"
            self.calls[call_id] = Call(kind="refund", key=key)
            return call_id, keyed_call(
                call_id, "propose_refund", self._refund_args(key), key, self.refund_ctx
            )
        if roll < 0.45:  # tenant-b's payment, asked by tenant-a's agent
            self.calls[call_id] = Call(kind="foreign", key=call_id)
            arguments = {"payment_id": FOREIGN_PAYMENT}
            return call_id, keyed_call(call_id, "get_payment", arguments, call_id, self.reader_ctx)
        self.calls[call_id] = Call(kind="read", key=f"chaos-{exp}-{n}")
        arguments = {"payment_id": "pay_A1001"}
        return call_id, keyed_call(call_id, "get_payment", arguments, call_id, self.reader_ctx)

    @staticmethod
    def _refund_args(key: str) -> dict[str, Any]:
        n = int(key.rsplit("-", 1)[1])
        return {"payment_id": PAYMENTS[n % len(PAYMENTS)], "amount_minor": 1, "reason": "chaos"}

    async def load(self, exp: str, seconds: float) -> int:
        """Send calls at RATE for ``seconds``; how many were made. Each call is sent on its own
        task, so that a send waiting for the broker (away, or its buffer full) never holds the
        next calls back: every call planned is made, at its time. A call whose send fails
        (broker away longer than the 60 s request timeout) is an agent's error, not a
        pipeline answer: its outcome is not checked, but it is counted (`unsent`), and too
        few acknowledged calls fail the experiment."""
        rng = random.Random(exp)
        producer = kafka_producer(self.settings, request_timeout_ms=60_000)
        await producer.start()
        sending: set[asyncio.Task[None]] = set()
        try:
            started, n = time.monotonic(), 0
            while (now := time.monotonic()) - started < seconds:
                for _ in range(max(int((now - started) * RATE) - n, 0)):
                    call_id, value = self.next_call(exp, n, rng)
                    n += 1
                    call = self.calls[call_id]
                    call.sent_at = time.monotonic()
                    task = asyncio.create_task(self._send(producer, call_id, call, value))
                    sending.add(task)
                    task.add_done_callback(sending.discard)
                await asyncio.sleep(0.05)
            if sending:
                await asyncio.wait(sending, timeout=SEND_WAIT_SECONDS)
            return n
        finally:
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, return_exceptions=True)
            await producer.stop()

    async def _send(self, producer: Any, call_id: str, call: Call, value: bytes) -> None:
        try:
            delivery = await producer.send(
                self.settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
            )
            await delivery
        except KafkaError:
            return  # not acknowledged: counted as unsent
        call.sent = True

    # --- one experiment ---------------------------------------------------------------------

    async def experiment(
        self, name: str, fault: Callable[[], Awaitable[None]], seconds: float = LOAD_SECONDS
    ) -> dict[str, Any]:
        stop = asyncio.Event()
        background = [
            asyncio.create_task(self.read_answers(stop)),
            asyncio.create_task(self.decide_approvals(stop)),
        ]
        try:
            load = asyncio.create_task(self.load(name, seconds))
            await asyncio.sleep(seconds / 3)
            fault_started = time.monotonic()
            await fault()
            fault_ended = time.monotonic()
            in_flight = [
                c
                for c, call in self.calls.items()
                if c.startswith(f"chaos-{name}-")
                and call.sent_at <= fault_ended
                and c not in self.answers.final_at
            ]
            sent = await load
            deadline = time.monotonic() + SETTLE_SECONDS
            while time.monotonic() < deadline and self._open(name):  # noqa: ASYNC110
                await asyncio.sleep(0.5)
            await asyncio.sleep(2)  # late repeats of outcomes, if any, are read too
            row = self.check(
                name, sent, fault_started, fault_ended, in_flight, planned=int(seconds * RATE)
            )
            row["streams_commit_lag"] = await self.streams_commit_lag()
            return row
        finally:
            stop.set()
            await asyncio.gather(*background, return_exceptions=True)

    async def streams_commit_lag(self, timeout: float = 45) -> dict[str, int]:
        """Once every call is answered, every stage has processed every record of its input
        topics (issue 17: after a broker bounce one partition stopped committing)."""
        return await commit_lag(self.settings, PIPELINE_INPUTS, timeout)

    def _mine(self, name: str) -> dict[str, Call]:
        return {
            c: call
            for c, call in self.calls.items()
            if c.startswith(f"chaos-{name}-") and call.sent
        }

    def _open(self, name: str) -> list[str]:
        return [c for c in self._mine(name) if c not in self.answers.final_at]

    def check(
        self,
        name: str,
        sent: int,
        fault_started: float,
        fault_ended: float,
        in_flight: list[str],
        *,
        planned: int,
    ) -> dict[str, Any]:
        mine = self._mine(name)
        in_flight = [c for c in in_flight if c in mine]  # acknowledged in the end
        outcomes = self.answers.outcomes
        lost = [c for c in mine if c not in self.answers.final_at]
        still_unknown = [c for c in lost if outcomes.get(c)]
        finals = {
            c: {o["status"] for o in outcomes.get(c, []) if o["status"] in SETTLED} for c in mine
        }
        twice = {c: sorted(s) for c, s in finals.items() if len(s) > 1}
        kinds = {c: call.kind for c, call in mine.items()}
        answers = {c: expectations.final_answers(outcomes.get(c, [])) for c in mine}
        unexpected = expectations.unexpected(
            kinds, answers, provider_fails=name in self.provider_fails
        )
        acknowledged = Counter(kinds.values())
        stats = provider_stats(self.pipeline.provider_url)
        effects = {k: v for k, v in stats["by_key"].items() if f":chaos-{name}-refund-" in k}
        history = History(effects=effects)
        for c, call in mine.items():
            if call.kind.startswith("refund"):
                history.proposed[c] = f"tenant-a:{call.key}"
                history.outcomes[c] = outcomes.get(c, [])
        problems = [p for p in history.problems(settled=True) if not p.startswith("lost")]
        ledger = self._ledger_succeeded(name)
        recovered = [self.answers.final_at[c] for c in in_flight if c in self.answers.final_at]
        latencies = [
            self.answers.final_at[c] - call.sent_at
            for c, call in mine.items()
            if c in self.answers.final_at
        ]
        row: dict[str, Any] = {
            "experiment": name,
            "planned": planned,
            "attempted": sent,
            "calls": len(mine),
            "unsent": sent - len(mine),
            "calls_by_kind": {kind: acknowledged[kind] for kind in expectations.KINDS},
            "lost": len(lost),
            "still_unknown": len(still_unknown),
            "two_final_outcomes": len(twice),
            "duplicate_effects": sum(1 for v in effects.values() if v > 1),
            "provider_effects": len(effects),
            "ledger_succeeded": len(ledger),
            "effects_equal_ledger": set(effects) == ledger,
            "history_problems": len(problems),
            "fault_seconds": round(fault_ended - fault_started, 1),
            "in_flight_at_fault_end": len(in_flight),
            # None: a call in flight at the fault's end never got its final outcome.
            "recovery_seconds": (
                None
                if len(recovered) < len(in_flight)
                else round(max(recovered) - fault_ended, 1)
                if recovered
                else 0.0
            ),
            "max_latency_seconds": round(max(latencies), 1) if latencies else 0.0,
            "approvals_pending_at_fault": self.pending_at_fault
            if name == "streams_kill9"
            else None,
            "poison": (
                {
                    "published": self.poison_sent,
                    "refused_by_broker": self.poison_refused,
                    "dead_letters": sum(self.answers.dead_letters.values()),
                }
                if name == "poison"
                else None
            ),
            "answers_by_kind": expectations.answers_by_kind(kinds, answers),
            "unexpected_outcomes": dict(unexpected),
            "minimums": expectations.minimums(planned),
            "shortfalls": expectations.shortfalls(planned, acknowledged, len(effects)),
            "examples": {
                "lost": lost[:5],
                "two_final_outcomes": list(twice.items())[:5],
                "history": problems[:5],
                "unexpected": sorted(
                    c for c, got in answers.items() if got - expectations.expected(kinds[c])
                )[:5],
                "effects_not_in_ledger": sorted(set(effects) - ledger)[:5],
                "ledger_not_in_effects": sorted(ledger - set(effects))[:5],
            },
        }
        return row

    def _ledger_succeeded(self, name: str) -> set[str]:
        with psycopg.connect(self.settings.storage.database_url) as conn:
            rows = conn.execute(
                "SELECT operation_id FROM command_ledger WHERE tenant = 'tenant-a' "
                "AND idempotency_key LIKE %s AND status = 'succeeded'",
                (f"chaos-{name}-refund-%",),
            ).fetchall()
        return {row[0] for row in rows}


class Suite(MixedLoad):
    """The mixed load on private single-host services, and the faults of `make chaos`."""

    def __init__(self, services: Services) -> None:
        super().__init__(services.pipeline)
        self.services = services

    # --- faults -----------------------------------------------------------------------------

    def restart_worker(self, name: str, command: str, **env: str) -> None:
        worker = self.pipeline.worker(name)
        worker.kill()  # SIGKILL, no clean shutdown
        self.pipeline.workers.remove(worker)
        self.pipeline.start(command, name, **env)

    async def kill_executor(self) -> None:
        await asyncio.to_thread(self.restart_worker, "executor", "executor")

    async def kill_streams(self) -> None:
        self.pending_at_fault = len(self.pending_decisions)
        await asyncio.to_thread(self.restart_worker, "streams", "streams")

    async def kill_broker(self) -> None:
        await asyncio.to_thread(self.services.kafka.kill)
        await asyncio.sleep(OUTAGE_SECONDS)
        await asyncio.to_thread(self.services.kafka.start)

    async def restart_redis(self) -> None:
        await asyncio.to_thread(self.services.redis.stop)
        await asyncio.to_thread(self.services.redis.start)

    async def flush_redis(self) -> None:
        client = redis.Redis.from_url(self.services.redis.url)
        try:
            await asyncio.to_thread(client.flushall)
        finally:
            client.close()

    async def stop_postgres(self) -> None:
        await asyncio.to_thread(self.services.postgres.stop)
        await asyncio.sleep(OUTAGE_SECONDS)
        await asyncio.to_thread(self.services.postgres.start)

    async def provider_faults(self) -> None:
        await asyncio.to_thread(faults, self.pipeline, fail_before=30, drop_after=10)
        await asyncio.sleep(5)
        await asyncio.to_thread(faults, self.pipeline, latency_ms=8000)
        await asyncio.sleep(15)
        await asyncio.to_thread(faults, self.pipeline)

    async def poison(self) -> None:
        producer = kafka_producer(self.settings)
        await producer.start()
        try:
            for topic in Topic:
                for key, value in _poison_records(topic):
                    try:
                        await producer.send_and_wait(
                            self.settings.topic(topic),
                            key=key.encode() if key else None,
                            value=value,
                        )
                    except KafkaError:
                        # The broker itself refuses some (a key-less record on a compacted
                        # topic): nothing reached a consumer.
                        self.poison_refused += 1
                    else:
                        self.poison_sent += 1
        finally:
            await producer.stop()


def _poison_records(topic: Topic) -> list[tuple[str | None, bytes]]:
    tag = f"poison-{topic.value}-{uuid.uuid4().hex[:6]}"
    big = json.dumps({"v": 1, "call_id": f"{tag}-big", "junk": "x" * 900_000}).encode()
    return [
        (f"{tag}-bytes", b"\xff\xfe not json at all \x00"),
        (None, b'{"v": 1, "call_id": null}'),
        (f"{tag}-version", json.dumps({"v": 99, "call_id": f"{tag}-version"}).encode()),
        (f"{tag}-big", big),
        (f"{tag}-array", b"[1, 2, 3]"),
    ]


EXPERIMENTS: list[tuple[str, Callable[[Suite], Callable[[], Awaitable[None]]]]] = [
    ("executor_kill9", lambda s: s.kill_executor),
    ("streams_kill9", lambda s: s.kill_streams),
    ("broker_kill9", lambda s: s.kill_broker),
    ("redis_restart", lambda s: s.restart_redis),
    ("redis_flushall", lambda s: s.flush_redis),
    ("postgres_stop", lambda s: s.stop_postgres),
    ("provider_faults", lambda s: s.provider_faults),
    ("poison", lambda s: s.poison),  # last: poison stays on the topics
]


def _never(seconds: float | None) -> str:
    return "never" if seconds is None else str(seconds)


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        "| experiment | calls (unsent) | effects | lost | duplicate effects | effects = ledger "
        "| unexpected outcomes | recovery (s) | max latency (s) | streams commit lag |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    lines += [
        f"| {r['experiment']} | {r['calls']} ({r['unsent']}) | {r['provider_effects']} "
        f"| {r['lost']} | {r['duplicate_effects']} "
        f"| {'yes' if r['effects_equal_ledger'] else 'NO'} "
        f"| {sum(r['unexpected_outcomes'].values())} | {_never(r['recovery_seconds'])} "
        f"| {r['max_latency_seconds']} | {sum(r['streams_commit_lag'].values())} |"
        for r in rows
    ]
    print("\n".join(lines))


@pytest.mark.timeout(3600)
def test_chaos(signing_keys: SigningKeys) -> None:
    required(kafka_jars(), "the Kafka jars and java for a private broker")
    required(server_binaries(), "PostgreSQL server binaries")
    if redis_server_binary() is None:
        pytest.fail("redis-server not found: run `make up` (deploy/local/up installs it)")
    chosen = [(n, f) for n, f in EXPERIMENTS if not ONLY or n in ONLY]
    assert chosen, f"RATIFIER_CHAOS_ONLY names no experiment of {[n for n, _ in EXPERIMENTS]}"
    rows: list[dict[str, Any]] = []
    alive: list[str] = []
    with isolated_services(signing_keys) as services:
        suite = Suite(services)
        try:
            for name, fault in chosen:
                rows.append(asyncio.run(suite.experiment(name, fault(suite))))
                print(f"chaos: {json.dumps(rows[-1])}", flush=True)
                dead = [w.name for w in services.pipeline.workers if w.process.poll() is not None]
                alive.append(f"{name}: {dead}" if dead else "")
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            report = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "load_seconds": LOAD_SECONDS,
                "rate_calls_per_s": RATE,
                "experiments": rows,
            }
            (ARTIFACTS / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
            _print_table(rows)
    failures = {r["experiment"]: v for r in rows if (v := expectations.violations(r))}
    assert not failures, f"guarantees violated: {failures} (test-artifacts/chaos.json)"
    assert not [a for a in alive if a], f"processes exited: {[a for a in alive if a]}"
