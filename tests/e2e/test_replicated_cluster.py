"""Three KRaft brokers (a private instance of deploy/local/kafka-cluster, apart from the shared
broker), topics with replication factor 3 and min.insync.replicas=2: the leader of the busiest
partitions is killed with SIGKILL under load and brought back.

- Kafka alone: idempotent `acks=all` producers and a consumer group through the failover;
  every acknowledged record is on the log exactly once, and the group reads every one.
- The real pipeline (worker processes given the three-broker bootstrap list): reads, denials
  and refunds through the stages and the executor; no call lost, no effect applied twice.

The measured times (leader re-election, the longest produce stall, the node's return to every
ISR) are written to test-artifacts/replicated-cluster.json and printed."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import tests.e2e.conftest as e2e_conftest
from config.settings import Settings
from ratifier.topics import delete_topics, ensure_topics
from schemas.names import Topic
from tests.e2e.conftest import ARTIFACTS, SigningKeys, start_pipeline
from tests.e2e.executor_kit import provider_stats, refund_command, seed_payments
from tests.e2e.history import SETTLED, History
from tests.kafka_instances import KafkaInstance
from tests.services import outcomes_by_call, proposal, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(420)]

PARTITIONS = 6
RECORDS = 6000
RATE = 400  # records per second: a 15 s run with the kill a third of the way in
RESULTS = ARTIFACTS / "replicated-cluster.json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaInstance]:
    instance = KafkaInstance(name=f"three-{uuid.uuid4().hex[:6]}", brokers=3)
    try:
        instance.up()
        yield instance
    finally:
        instance.down()


def record_result(name: str, values: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = values
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(f"\n{name}: {json.dumps(values, sort_keys=True)}")


async def describe(bootstrap: str, topics: list[str]) -> list[dict[str, Any]]:
    """Every partition of ``topics`` with its leader and ISR."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        found = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return [{"topic": t["topic"], **p} for t in found for p in t["partitions"]]


async def busiest_leader(bootstrap: str, topics: list[str]) -> int:
    """The broker that leads the most partitions (every partition carries the same load)."""
    leaders = Counter(p["leader"] for p in await describe(bootstrap, topics))
    return int(leaders.most_common(1)[0][0])


async def wait_partitions(
    bootstrap: str, topics: list[str], ok: Any, timeout: float, what: str
) -> float:
    """Seconds until ``ok(partition)`` holds for every partition (describe errors while a
    broker is gone count as not yet)."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < timeout:
        try:
            last = await describe(bootstrap, topics)
            if last and all(ok(p) for p in last):
                return time.monotonic() - started
        except Exception as exc:  # the admin may have picked the dead broker: ask again
            last = repr(exc)
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout}s: {last}")


async def create_replicated_topic(bootstrap: str, name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    name=name,
                    num_partitions=PARTITIONS,
                    replication_factor=3,
                    topic_configs={"min.insync.replicas": "2"},
                )
            ]
        )
    finally:
        await admin.close()


async def read_log(bootstrap: str, topic: str) -> list[bytes]:
    """Every value on ``topic`` up to its current end, read by a group-less consumer."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        tps = sorted(consumer.assignment())
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            for tp, batch in (await consumer.getmany(*remaining, timeout_ms=1000)).items():
                values.extend(r.value for r in batch if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return values


class GroupReader:
    """A consumer group reading through the failover, committing after every batch."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"failover-{uuid.uuid4().hex[:6]}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.seen: Counter[bytes] = Counter()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.consumer.start()
        try:
            while not self.stop.is_set():
                batches = await self.consumer.getmany(timeout_ms=200)
                for batch in batches.values():
                    self.seen.update(r.value for r in batch)
                if batches:
                    try:
                        await self.consumer.commit()
                    except Exception:  # a coordinator move: the next batch commits again
                        await asyncio.sleep(0.2)
        finally:
            await self.consumer.stop()


def note_ack(acks: dict[int, list[float]], future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        acks[future.result().partition].append(time.monotonic())


async def failover_under_load(cluster: KafkaInstance) -> dict[str, Any]:
    bootstrap = cluster.bootstrap
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    await create_replicated_topic(bootstrap, topic)
    await wait_partitions(bootstrap, [topic], lambda p: len(p["isr"]) == 3, 30, "full ISR")
    reader = GroupReader(bootstrap, topic)
    reading = asyncio.create_task(reader.run())
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=30_000,
        retry_backoff_ms=100,
    )
    await producer.start()
    acks: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    sent: list[tuple[bytes, asyncio.Future[Any]]] = []
    killed = 0
    killed_at = 0.0
    reelection = 0.0
    restart: asyncio.Task[float] | None = None
    try:
        started = time.monotonic()
        for n in range(RECORDS):
            if n == RECORDS // 3:
                killed = await busiest_leader(bootstrap, [topic])
                cluster.kill9(killed)
                killed_at = time.monotonic()
                gone = killed
                reelection = await wait_partitions(
                    bootstrap,
                    [topic],
                    lambda p, gone=gone: p["leader"] not in (gone, -1),
                    60,
                    "new leaders",
                )
            if n == 2 * RECORDS // 3:
                restart = asyncio.create_task(asyncio.to_thread(cluster.up))
            value = f"r{n}".encode()
            future = await producer.send(topic, key=value, value=value)
            future.add_done_callback(functools.partial(note_ack, acks))
            sent.append((value, future))
            delay = started + (n + 1) / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        outcomes = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
    finally:
        await producer.stop()
    failed = [v for (v, _), o in zip(sent, outcomes, strict=True) if isinstance(o, BaseException)]
    assert restart is not None
    restart_seconds = await restart
    rejoined = await wait_partitions(
        bootstrap, [topic], lambda p: len(p["isr"]) == 3, 120, "the node back in every ISR"
    )
    acknowledged = {
        v for (v, _), o in zip(sent, outcomes, strict=True) if not isinstance(o, BaseException)
    }
    log = await read_log(bootstrap, topic)
    deadline = time.monotonic() + 60
    while not acknowledged <= set(reader.seen) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    reader.stop.set()
    await reading
    # The longest gap between two acknowledgements on one partition after the kill: how long
    # producers waited for the new leaders.
    stall = max(
        (b - a for times in acks.values() for a, b in itertools.pairwise(times) if b > killed_at),
        default=0.0,
    )
    counts = Counter(log)
    return {
        "records_sent": len(sent),
        "failed_sends": len(failed),
        "acknowledged": len(acknowledged),
        "lost": len(acknowledged - set(counts)),
        "duplicates_on_log": sum(c - 1 for c in counts.values() if c > 1),
        "group_missed": len(acknowledged - set(reader.seen)),
        "group_redelivered": sum(c - 1 for c in reader.seen.values() if c > 1),
        "killed_broker": killed,
        "leader_reelection_s": round(reelection, 2),
        "longest_produce_stall_s": round(stall, 2),
        "restart_s": round(restart_seconds, 2),
        "back_in_every_isr_s": round(rejoined, 2),
    }


def test_leader_killed_under_load_loses_and_duplicates_nothing(cluster: KafkaInstance) -> None:
    result = run(failover_under_load(cluster))
    record_result("kafka_failover", result)
    assert result["failed_sends"] == 0, result
    assert result["acknowledged"] == RECORDS, result
    assert result["lost"] == 0, result
    assert result["duplicates_on_log"] == 0, result
    assert result["group_missed"] == 0, result
    assert result["killed_broker"] in (1, 2, 3)
    # The node came back and caught up: replication factor 3 holds again everywhere.
    assert result["back_in_every_isr_s"] >= 0


# ------------------------------------------------------------ the pipeline --


async def publish_idempotent(
    settings: Settings, records: list[tuple[str, bytes]], topic: Topic
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        for key, value in records:
            await producer.send(settings.topic(topic), key=key.encode(), value=value)
        await producer.flush()
    finally:
        await producer.stop()


def mixed_wave(settings: Settings, history: History, proposed: set[str], size: int) -> None:
    """Reads and denials through every stage (``proposed``), refunds straight to the executor
    (``history``: their effects are counted at the provider)."""
    calls = []
    for n in range(size):
        kind = n % 4
        if kind == 0:
            call = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
        elif kind == 1:
            call = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_B2001"})
        elif kind == 2:
            call = proposal(settings, tool="refund_everything", arguments={})
        else:
            call = None
        if call is not None:
            proposed.add(call["call_id"])
            calls.append((call["call_id"], json.dumps(call).encode()))
    refunds = [refund_command(f"c-{uuid.uuid4().hex[:12]}") for _ in range(size // 4)]
    for command in refunds:
        history.proposed[command.call_id] = command.operation_id
    run(publish_idempotent(settings, calls, Topic.PROPOSED))
    run(
        publish_idempotent(
            settings, [(c.operation_id, c.to_bytes()) for c in refunds], Topic.COMMITTED
        )
    )


def where_calls_stopped(records: list[Any], calls: set[str]) -> dict[str, Counter[str]]:
    """For each topic, how many of ``calls`` have a record on it (by the ``call_id`` in the
    value: every pipeline record carries its call's id)."""
    found: dict[str, Counter[str]] = {}
    for record in records:
        try:
            call_id = json.loads(record.value).get("call_id")
        except (ValueError, AttributeError):
            continue
        if call_id in calls:
            found.setdefault(record.topic.split(".", 1)[1], Counter())[call_id] += 1
    return found


def unanswered_report(pipeline: Any, expected: set[str]) -> str:
    """What a timeout leaves to diagnose: the calls without an outcome, the furthest topic each
    reached, and every worker's log tail."""
    settings = pipeline.settings
    records = run(read_to_end(settings, list(Topic)))
    missing = expected - set(outcomes_by_call(records))
    reached = where_calls_stopped(records, missing)
    tails = "\n".join(
        f"--- {w.name} (alive: {w.process.poll() is None})\n{w.log_tail()}"
        for w in pipeline.workers
    )
    return (
        f"{len(missing)} of {len(expected)} calls have no outcome; of those, records per "
        f"topic: { {t: len(c) for t, c in sorted(reached.items())} }; e.g. "
        f"{sorted(missing)[:5]}\n{tails}"
    )


def test_pipeline_through_a_killed_leader(
    cluster: KafkaInstance, signing_keys: SigningKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers take the three-broker bootstrap list from RATIFIER_KAFKA_BOOTSTRAP (faust and
    # aiokafka both accept host:port,host:port); the pipeline's topics are replicated.
    monkeypatch.setenv("RATIFIER_KAFKA_BOOTSTRAP", cluster.bootstrap)
    monkeypatch.setattr(
        e2e_conftest,
        "ensure_topics",
        functools.partial(ensure_topics, replication_factor=3, min_insync_replicas=2),
    )
    pipeline = start_pipeline(signing_keys, f"cluster-{uuid.uuid4().hex[:4]}", executors=2)
    settings = pipeline.settings
    assert settings.kafka_bootstrap == cluster.bootstrap
    seed_payments(settings)
    pipeline.start("reconciler", "reconciler", RATIFIER_RECONCILER__BACKOFF_SECONDS="0.2")
    history = History()
    proposed: set[str] = set()
    try:
        topics = [settings.topic(t) for t in (Topic.PROPOSED, Topic.COMMITTED, Topic.OUTCOMES)]
        mixed_wave(settings, history, proposed, 200)
        killed = run(busiest_leader(settings.kafka_bootstrap, topics))
        cluster.kill9(killed)
        killed_at = time.monotonic()
        mixed_wave(settings, history, proposed, 200)  # during the failover
        cluster.up()
        restarted = time.monotonic() - killed_at
        mixed_wave(settings, history, proposed, 200)
        try:
            records = run(
                read_until(
                    settings,
                    [Topic.OUTCOMES],
                    lambda recs: proposed | set(history.proposed) <= set(outcomes_by_call(recs)),
                    timeout=180,
                )
            )
        except TimeoutError as exc:
            raise AssertionError(
                unanswered_report(pipeline, proposed | set(history.proposed))
            ) from exc
        all_answered = time.monotonic() - killed_at
        deadline = time.monotonic() + 90
        while True:
            history.outcomes = outcomes_by_call(records)
            history.effects = provider_stats(pipeline.provider_url)["by_key"]
            problems = history.problems(settled=True)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(1)
            records = run(read_to_end(settings, [Topic.OUTCOMES]))
        outcomes = outcomes_by_call(records)
        unsettled = [c for c in proposed if not {o["status"] for o in outcomes[c]} & SETTLED]
        settled_twice = [
            c for c in proposed if len({o["status"] for o in outcomes[c]} & SETTLED) > 1
        ]
        alive = pipeline.alive()
        tails = "" if alive else "\n".join(f"{w.name}: {w.log_tail()}" for w in pipeline.workers)
    finally:
        pipeline.stop()
        run(delete_topics(settings))
    record_result(
        "pipeline_failover",
        {
            "calls_through_stages": len(proposed),
            "refunds_to_executor": len(history.proposed),
            "effects": sum(history.effects.values()),
            "problems": len(problems),
            "killed_broker": killed,
            "restart_s": round(restarted, 2),
            "every_call_answered_after_kill_s": round(all_answered, 2),
        },
    )
    assert problems == [], problems[:20]
    assert unsettled == [], unsettled[:20]
    assert settled_twice == [], settled_twice[:20]
    assert alive, tails
    assert history.effects, "the refunds applied no effect at all"
    assert set(history.effects.values()) == {1}
