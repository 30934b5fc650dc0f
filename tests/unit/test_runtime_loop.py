"""The runtime's consumer loop with a fake consumer and producer: per-record isolation,
transient errors waited out, offsets committed only after acknowledgements and only for
assigned partitions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError, MessageSizeTooLargeError

from config.settings import Settings
from runtime.emit import Emit
from runtime.health import Health
from runtime.loop import (
    BatchLoop,
    ConsumerLoop,
    Handled,
    LaneLoop,
    PartitionLoop,
    by_key,
    call_id_in,
    consumer_loop,
    failed,
)
from runtime.retry import BACKOFF_SECONDS, Stopped, backoff, retrying
from schemas.envelopes import DeadLetter, Outcome, SourcePosition, Stage, Status
from schemas.errors import ErrorCode, StorageUnavailable
from schemas.names import Topic

SETTINGS = Settings(topic_prefix="u.")
TP = TopicPartition("u.commands.committed", 0)
TP2 = TopicPartition("u.commands.committed", 1)
LIMIT = 10_000


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def rec(offset: int, value: bytes, *, partition: int = 0, key: bytes | None = None) -> Rec:
    return Rec(TP.topic, partition, offset, key, value)


class FakeConsumer:
    def __init__(self, batches: list[dict[TopicPartition, list[Rec]]], loop: Any = None) -> None:
        self.batches = batches
        self.loop = loop
        self.committed: list[dict[TopicPartition, int]] = []
        self.assigned = {TP, TP2}
        self.refuse_commit = False
        self.paused_now: set[TopicPartition] = set()
        self.pauses: list[TopicPartition] = []

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        if not self.batches:
            self.loop.stop()
            return {}
        return self.batches.pop(0)

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_now)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_now.update(tps)
        self.pauses.extend(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_now.difference_update(tps)

    def highwater(self, _tp: TopicPartition) -> int:
        return 0

    async def position(self, _tp: TopicPartition) -> int:
        return 0

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.refuse_commit:
            raise CommitFailedError("rebalanced")
        self.committed.append(offsets)


class FakeProducer:
    """Refuses values over LIMIT at send time; ``fail_acks`` fails the acknowledgement of
    records whose value contains a marker; ``unavailable`` send attempts fail transiently."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.fail_acks: bytes | None = None
        self.unavailable = 0

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes, headers: Any
    ) -> asyncio.Future[Any]:
        if self.unavailable:
            self.unavailable -= 1
            raise KafkaConnectionError("broker away")
        if len(value) > LIMIT:
            raise MessageSizeTooLargeError("too large")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail_acks is not None and self.fail_acks in value and b'"result":{' in value:
            future.set_exception(MessageSizeTooLargeError("broker refused"))
        else:
            self.sent.append((topic, key, value))
            future.set_result(None)
        return future

    def on(self, topic: Topic) -> list[dict[str, Any]]:
        return [json.loads(v) for t, _k, v in self.sent if t == SETTINGS.topic(topic)]


def answer(call_id: str, *, big: bool = False, status: Status = Status.SUCCEEDED) -> Outcome:
    return Outcome(
        call_id=call_id,
        tool="get_payment",
        tenant="tenant-a",
        status=status,
        stage=Stage.EXECUTE,
        result={"pad": "x" * (2 * LIMIT)} if big else {"ok": True},
        at=datetime.now(UTC),
    )


async def handle(records: Sequence[Rec]) -> list[Handled]:
    """A handler: b"boom" raises, b"big:<id>" answers too large, others answer their id."""
    results = []
    for record in records:
        value = record.value or b""
        if value.startswith(b"boom"):
            raise RuntimeError("a bug triggered by one record")
        if value.startswith(b"fail"):
            results.append(Handled(failure="cannot handle", call_id="c-fail"))
            continue
        big = value.startswith(b"big:")
        call_id = value.split(b":")[-1].decode()
        outcome = answer(call_id, big=big)
        results.append(Handled(emits=(Emit(topic=Topic.OUTCOMES, key=call_id, value=outcome),)))
    return results


def make_loop(consumer: FakeConsumer, producer: FakeProducer, **options: Any) -> ConsumerLoop:
    loop = consumer_loop(
        SETTINGS,
        consumer,
        producer,
        stage="execute",
        group="g",
        handle=options.pop("handle", handle),
        answers=Stage.EXECUTE,
        **options,
    )
    consumer.loop = loop
    return loop


async def test_a_failing_or_oversized_record_costs_only_itself() -> None:
    batch = {
        TP: [
            rec(0, b"ok:c-0"),
            rec(1, b'boom {"call_id": "c-boom"}'),
            rec(2, b"ok:c-2"),
            rec(3, b"big:c-big"),
        ],
        TP2: [rec(7, b"ok:c-7", partition=1), rec(8, b"fail", partition=1)],
    }
    consumer, producer = FakeConsumer([batch]), FakeProducer()
    loop = make_loop(consumer, producer)
    await loop.run()

    outcomes = {o["call_id"]: o for o in producer.on(Topic.OUTCOMES)}
    assert {c: o["status"] for c, o in outcomes.items()} == {
        "c-0": "succeeded",
        "c-2": "succeeded",
        "c-7": "succeeded",
        # An internal error: the call failed, with a typed error.
        "c-boom": "failed",
        "c-fail": "failed",
        # The effect happened but its result did not fit: the outcome stays, without result.
        "c-big": "succeeded",
    }
    assert outcomes["c-boom"]["error"]["code"] == ErrorCode.PERMANENT_ERROR.value
    assert outcomes["c-big"]["result"] is None
    letters = [DeadLetter.model_validate(d) for d in producer.on(Topic.DEADLETTER)]
    assert sorted(str(d.call_id) for d in letters) == ["c-big", "c-boom", "c-fail"]
    assert {d.source.offset for d in letters} == {1, 3, 8}
    assert loop.dead_lettered == 3
    # Every offset of the batch is committed, after the acknowledgements.
    assert consumer.committed == [{TP: 4, TP2: 9}]
    assert loop.processed == 6


async def test_a_record_the_broker_refuses_is_dead_lettered_alone() -> None:
    consumer, producer = (
        FakeConsumer([{TP: [rec(0, b"ok:c-0"), rec(1, b"ok:c-refused")]}]),
        (FakeProducer()),
    )
    # The broker refuses c-refused's outcome with its result, not without.
    producer.fail_acks = b'"call_id":"c-refused"'
    await make_loop(consumer, producer).run()
    outcomes = producer.on(Topic.OUTCOMES)
    assert [(o["call_id"], o["result"]) for o in outcomes] == [
        ("c-0", {"ok": True}),
        ("c-refused", None),
    ]
    (letter,) = producer.on(Topic.DEADLETTER)
    assert letter["source"]["offset"] == 1
    assert consumer.committed == [{TP: 2}]


async def test_a_broker_away_is_waited_out_not_skipped() -> None:
    consumer, producer = FakeConsumer([{TP: [rec(0, b"ok:c-0")]}]), FakeProducer()
    producer.unavailable = 2
    loop = make_loop(consumer, producer)
    await loop.run()
    assert [o["call_id"] for o in producer.on(Topic.OUTCOMES)] == ["c-0"]
    assert producer.on(Topic.DEADLETTER) == []
    assert loop.dead_lettered == 0
    assert consumer.committed == [{TP: 1}]


class CountingHealth(Health):
    beats = 0

    def beat(self) -> None:
        self.beats += 1
        super().beat()


async def test_waiting_out_a_broker_keeps_the_service_alive() -> None:
    """Every wait for the broker beats the service's liveness (a probe must not restart a
    service that waits out a broker outage)."""
    beats = []
    for unavailable in (0, 2):
        consumer, producer = FakeConsumer([{TP: [rec(0, b"ok:c-0")]}]), FakeProducer()
        producer.unavailable = unavailable
        health = CountingHealth("test")
        await make_loop(consumer, producer, health=health).run()
        assert consumer.committed == [{TP: 1}]
        beats.append(health.beats)
    assert beats[1] - beats[0] == 2


async def test_storage_away_is_retried_and_a_stop_commits_nothing() -> None:
    calls = 0

    async def flaky(records: Sequence[Rec]) -> list[Handled]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise StorageUnavailable()
        return await handle(records)

    consumer, producer = FakeConsumer([{TP: [rec(0, b"ok:c-0")]}]), FakeProducer()
    await make_loop(consumer, producer, handle=flaky).run()
    assert calls == 3
    assert consumer.committed == [{TP: 1}]

    async def down(records: Sequence[Rec]) -> list[Handled]:
        loop.stop()
        raise StorageUnavailable()

    consumer, producer = FakeConsumer([{TP: [rec(0, b"ok:c-0")]}]), FakeProducer()
    loop = make_loop(consumer, producer, handle=down)
    await loop.run()
    assert consumer.committed == []
    assert producer.sent == []


async def test_only_assigned_partitions_are_committed_and_a_refused_commit_is_survived() -> None:
    batch = {TP: [rec(0, b"ok:c-0")], TP2: [rec(0, b"ok:c-1", partition=1)]}
    consumer, producer = FakeConsumer([batch]), FakeProducer()
    consumer.assigned = {TP}
    crashed: list[str] = []
    await make_loop(consumer, producer, before_commit=lambda: crashed.append("x")).run()
    assert consumer.committed == [{TP: 1}]
    assert crashed == ["x"]

    consumer, producer = FakeConsumer([batch, {TP: [rec(1, b"ok:c-2")]}]), FakeProducer()
    consumer.refuse_commit = True
    loop = make_loop(consumer, producer)
    await loop.run()
    assert loop.processed == 3  # the loop went on after the refused commit


async def test_tick_output_is_published_with_the_same_isolation() -> None:
    async def tick() -> list[Handled]:
        return [
            Handled(emits=(Emit(topic=Topic.OUTCOMES, key="c-t", value=answer("c-t")),)),
            Handled(emits=(Emit(topic=Topic.OUTCOMES, key="c-b", value=answer("c-b", big=True)),)),
        ]

    consumer, producer = FakeConsumer([]), FakeProducer()
    await make_loop(consumer, producer, tick=tick).run()
    outcomes = producer.on(Topic.OUTCOMES)
    assert sorted(o["call_id"] for o in outcomes) == ["c-b", "c-t"]
    assert next(o for o in outcomes if o["call_id"] == "c-b")["result"] is None


async def test_by_key_keeps_order_per_key_and_isolates_exceptions() -> None:
    seen: list[int] = []

    async def one(record: Rec) -> Handled:
        await asyncio.sleep(0.001 * (5 - record.offset))
        if record.value == b"boom":
            raise ValueError("bug")
        seen.append(record.offset)
        return Handled(status="ok")

    records = [
        rec(0, b"a", key=b"k1"),
        rec(1, b"boom", key=b"k2"),
        rec(2, b"a", key=b"k1"),
        rec(3, b"a", key=b"k2"),
    ]
    results = await by_key(records, one, concurrency=asyncio.Semaphore(4))
    assert [r.failure for r in results] == [None, "internal error", None, None]
    assert seen.index(0) < seen.index(2)


def test_failed_answers_with_a_bounded_dead_letter_and_a_typed_outcome() -> None:
    raw = b'{"call_id": "c-9", "pad": "' + b"x" * 900_000 + b'"}'
    source = SourcePosition(topic="t", partition=1, offset=2)
    letter, outcome = failed(raw, reason="r", source=source, stage=Stage.VALIDATE, call_id="c-9")
    assert isinstance(letter.value, DeadLetter)
    assert letter.value.raw_size == len(raw)
    assert len(letter.value.to_bytes()) < 10_000
    assert isinstance(outcome.value, Outcome)
    assert (outcome.value.status, outcome.value.stage) == (Status.FAILED, Stage.VALIDATE)
    # No stage that answers calls, or no readable call id: the dead letter alone.
    assert len(failed(raw, reason="r", source=source, stage=None, call_id="c-9")) == 1
    assert len(failed(b"\xff", reason="r", source=source, stage=Stage.EXECUTE)) == 1
    assert call_id_in(raw) == "c-9"
    assert call_id_in(b"x" * 5000 + b'"call_id": "late"') is None


async def test_retrying_backs_off_and_stops() -> None:
    assert backoff(0) == BACKOFF_SECONDS[0]
    assert backoff(99) == BACKOFF_SECONDS[-1]
    tries = 0
    checked: list[bool] = []

    async def step() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise StorageUnavailable()
        return "done"

    async def check() -> None:
        checked.append(True)

    result = await retrying(step, retry_on=(StorageUnavailable,), what="x", first_retry=check)
    assert (result, tries, checked) == ("done", 3, [True])

    stop = asyncio.Event()

    async def never() -> str:
        stop.set()
        raise StorageUnavailable()

    with pytest.raises(Stopped):
        await retrying(never, retry_on=(StorageUnavailable,), what="x", stop=stop)


async def test_limits_are_aligned() -> None:
    """A validated call fits a Kafka record; every client may carry what a topic accepts."""
    from pydantic import ValidationError

    from runtime.clients import fetch_bytes, kafka_producer

    with pytest.raises(ValidationError, match="max_record_bytes"):
        Settings(limits={"max_record_bytes": 900_000})
    settings = Settings(limits={"kafka_max_message_bytes": 2_000_000})
    assert fetch_bytes(settings) > settings.limits.kafka_max_message_bytes
    producer = kafka_producer(settings)
    try:
        assert producer._max_request_size == settings.limits.kafka_max_message_bytes
    finally:
        await producer.stop()


class LaneConsumer(FakeConsumer):
    """Hands out its batches one poll at a time, then waits (as a consumer with nothing new
    does) until ``done`` is set, then stops the loop."""

    def __init__(self, batches: list[dict[TopicPartition, list[Rec]]]) -> None:
        super().__init__(batches)
        self.done = asyncio.Event()

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        if self.batches:
            return self.batches.pop(0)
        try:
            await asyncio.wait_for(self.done.wait(), timeout=timeout_ms / 1000)
        except TimeoutError:
            return {}
        self.loop.stop()
        return {}


def by_tenant(record: Rec) -> bytes:
    return (record.key or b"").split(b":")[0]


async def test_lanes_publish_a_few_records_before_another_lane_s_many() -> None:
    """With lanes, B's record polled after A's burst started is handled and published while
    the burst (bulk, giving way at its yield points) is still being handled; each lane keeps
    its order; offsets move only past what is acknowledged."""
    from runtime.turns import BULK_RECORDS, turn

    a_many = [rec(i, f"A:a{i}".encode(), key=b"tenant-a:k") for i in range(BULK_RECORDS)]
    b_one = rec(0, b"B:b0", partition=1, key=b"tenant-b:k")
    consumer = LaneConsumer([{TP: a_many}, {TP2: [b_one]}])
    producer = FakeProducer()
    handled: list[str] = []
    a_started = asyncio.Event()
    sent_when_a_ended: list[int] = []

    async def slow(records: Sequence[Rec]) -> list[Handled]:
        for record in records:
            if len(records) > 1:
                a_started.set()
                await asyncio.sleep(0.001)  # A's burst takes a while
                await turn()  # and gives way here to B's record
            handled.append((record.value or b"").decode())
        if len(records) > 1:
            sent_when_a_ended.append(len(producer.sent))
            consumer.done.set()
        return await handle(records)

    loop = make_loop(consumer, producer, handle=slow, lane=by_tenant)
    consumer.loop = loop
    await asyncio.wait_for(loop.run(), timeout=10)
    assert a_started.is_set()
    a_order = [v for v in handled if v.startswith("A:")]
    assert a_order == [f"A:a{i}" for i in range(BULK_RECORDS)]
    # B's outcome was acknowledged before A's handler had finished its burst.
    assert sent_when_a_ended == [1]
    assert next(o["call_id"] for o in producer.on(Topic.OUTCOMES)) == "b0"
    assert len(producer.on(Topic.OUTCOMES)) == BULK_RECORDS + 1
    committed: dict[TopicPartition, int] = {}
    for offsets in consumer.committed:
        committed |= offsets
    assert committed == {TP: BULK_RECORDS, TP2: 1}
    assert loop.processed == BULK_RECORDS + 1


async def test_a_partition_s_backlog_is_paused_and_the_others_are_polled_on() -> None:
    """Lanes: once a partition has a poll batch's worth of records waiting, the consumer
    pauses it and goes on polling the others, so B's record on another partition is fetched
    and handled while A's backlog is still being handled (before, the loop stopped polling
    at two poll batches' worth, A's next batch filled them, and B's record stayed in the
    broker); A's partition is resumed, and nothing stays paused when the loop ends."""
    a_many = [rec(i, f"ok:a{i}".encode(), key=b"tenant-a:k") for i in range(4)]
    b_one = rec(0, b"ok:b0", partition=1, key=b"tenant-b:k")

    class Pausing(LaneConsumer):
        """Hands out the first of its batches on no paused partition."""

        async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
            for batch in self.batches:
                if not set(batch) & self.paused_now:
                    self.batches.remove(batch)
                    return batch
            return await super().getmany(timeout_ms=timeout_ms, max_records=max_records)

    consumer = Pausing([{TP: a_many[:2]}, {TP: a_many[2:]}, {TP2: [b_one]}])
    producer = FakeProducer()
    b_done = asyncio.Event()
    paused_while_b: list[set[TopicPartition]] = []

    async def slow(records: Sequence[Rec]) -> list[Handled]:
        if records[0].partition == TP.partition:
            # A's lane waits (as a slow provider would) until B's record has been handled.
            await asyncio.wait_for(b_done.wait(), timeout=5)
            if records[-1].offset == len(a_many) - 1:
                consumer.done.set()
        else:
            paused_while_b.append(consumer.paused())
            b_done.set()
        return await handle(records)

    loop = make_loop(consumer, producer, handle=slow, lane=by_tenant, max_records=2)
    await asyncio.wait_for(loop.run(), timeout=10)
    assert b_done.is_set()
    assert paused_while_b == [{TP}]
    assert TP2 not in consumer.pauses
    assert consumer.paused() == set()
    assert len(producer.on(Topic.OUTCOMES)) == len(a_many) + 1


def test_outstanding_offsets_commit_up_to_the_first_not_acknowledged() -> None:
    """Lanes' offsets: a partition's records acknowledged out of order (by different lanes)
    move its offset only past the first not yet acknowledged; a revoked partition is
    forgotten."""
    from runtime.loop import _Outstanding

    offsets = _Outstanding()
    records = [rec(i, b"x", key=b"t:k") for i in range(10, 14)]
    offsets.polled(TP, records)
    assert offsets.open == 4
    assert offsets.committable() == {TP: 10}
    offsets.acknowledged(records[1:3])
    assert offsets.committable() == {}  # still 10: the record at 10 is not acknowledged
    offsets.acknowledged(records[:1])
    assert offsets.committable() == {TP: 13}
    offsets.acknowledged(records[3:])
    assert offsets.committable() == {TP: 14}
    assert offsets.open == 0
    offsets.polled(TP2, [rec(0, b"x", partition=1)])
    assert offsets.keep({TP}) == {TP2}
    assert offsets.open == 0
    assert offsets.committable() == {}


async def test_a_lane_that_fails_its_batch_costs_only_its_own_record() -> None:
    """Lanes keep per-record isolation: a record that breaks its lane's batch is answered
    alone, and the other lane is published as usual."""
    batch = {
        TP: [rec(0, b"ok:a1", key=b"tenant-a:1"), rec(1, b"boom", key=b"tenant-a:2")],
        TP2: [rec(2, b"ok:b1", partition=1, key=b"tenant-b:1")],
    }
    consumer = LaneConsumer([batch])
    consumer.done.set()
    producer = FakeProducer()
    loop = make_loop(consumer, producer, lane=by_tenant)
    consumer.loop = loop
    await asyncio.wait_for(loop.run(), timeout=10)
    ids = sorted(o["call_id"] for o in producer.on(Topic.OUTCOMES) if o["status"] == "succeeded")
    assert ids == ["a1", "b1"]
    assert len(producer.on(Topic.DEADLETTER)) == 1
    assert loop.dead_lettered == 1
    committed: dict[TopicPartition, int] = {}
    for offsets in consumer.committed:
        committed |= offsets
    assert committed == {TP: 2, TP2: 3}


def test_prompt_fetches_waits_briefly_only_while_a_partition_is_held() -> None:
    """The fetch pacing (runtime/clients.py, prompt_fetches): no prefetch backoff; a fetch
    planned while a partition's records are still held waits HELD_FETCH_WAIT_MS on the broker,
    one planned with none held the consumer's own wait; the fetcher wakes every
    FETCHER_WAKE_MS (aiokafka's 200 ms stays for every other consumer)."""
    from runtime.clients import FETCHER_WAKE_MS, HELD_FETCH_WAIT_MS, prompt_fetches

    class Fetcher:
        def __init__(self) -> None:
            self._records: dict[TopicPartition, object] = {}
            self._fetch_max_wait_ms = 500
            self._prefetch_backoff = 0.1
            self._fetcher_timeout = 0.2
            self.waits: list[int] = []

        def _get_actions_per_node(self, assignment: Any) -> str:
            self.waits.append(self._fetch_max_wait_ms)
            return "planned"

    class Assignment:
        tps = frozenset({TP, TP2})

    class Consumer:
        def __init__(self) -> None:
            self._fetcher = Fetcher()

    consumer = Consumer()
    assert prompt_fetches(consumer) is True
    fetcher = consumer._fetcher
    assert fetcher._prefetch_backoff == 0
    assert fetcher._fetcher_timeout == FETCHER_WAKE_MS / 1000 < 0.2
    assert fetcher._get_actions_per_node(Assignment()) == "planned"
    fetcher._records[TP] = object()
    fetcher._get_actions_per_node(Assignment())
    del fetcher._records[TP]
    fetcher._get_actions_per_node(Assignment())
    assert fetcher.waits == [500, HELD_FETCH_WAIT_MS, 500]

    class NotStarted:
        pass

    assert prompt_fetches(NotStarted()) is False


async def test_a_lane_s_records_are_handled_in_slices_of_lane_records_in_order() -> None:
    records = [rec(i, f"ok:a{i}".encode(), key=b"tenant-a:k") for i in range(5)]
    consumer = LaneConsumer([{TP: records}])
    producer = FakeProducer()
    batches: list[list[int]] = []

    async def sliced(batch: Sequence[Rec]) -> list[Handled]:
        batches.append([r.offset for r in batch])
        if sum(len(b) for b in batches) == len(records):
            consumer.done.set()
        return await handle(batch)

    loop = make_loop(consumer, producer, handle=sliced, lane=by_tenant, lane_records=2)
    consumer.loop = loop
    await asyncio.wait_for(loop.run(), timeout=10)
    assert batches == [[0, 1], [2, 3], [4]]
    assert [o["call_id"] for o in producer.on(Topic.OUTCOMES)] == [f"a{i}" for i in range(5)]
    committed: dict[TopicPartition, int] = {}
    for offsets in consumer.committed:
        committed |= offsets
    assert committed == {TP: 5}


def few(tenant: str, offset: int, partition: int = 0) -> Rec:
    value, key = f"ok:{tenant}{offset}".encode(), f"{tenant}:k".encode()
    return rec(offset, value, partition=partition, key=key)


def names(records: Sequence[Rec]) -> list[str]:
    return [(r.value or b"").decode().removeprefix("ok:") for r in records]


async def test_lanes_with_few_records_are_handled_together_and_a_backlog_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 46: the lanes with few records ready at once are handled (and published) as one
    batch, at most ``lane_records`` records; a lane with a backlog (bulk) is handled alone.
    The few-record lanes polled while a group is in flight wait for it to end and go together
    in the next, and a grouped lane's next records wait for its group; each lane keeps its
    order."""
    from runtime import loop as loop_module
    from runtime.turns import BULK_RECORDS

    monkeypatch.setattr(loop_module, "LANE_GROUP_WAIT_SECONDS", 30.0)
    e_many = [few("e", 10 + i) for i in range(BULK_RECORDS)]
    first = {
        TP: [few("a", 0), few("b", 1), few("c", 2), *e_many],
        TP2: [few("d", 0, partition=1), few("f", 1, partition=1)],
    }
    then = {TP: [few("g", 80)], TP2: [few("d", 2, partition=1)]}
    consumer = LaneConsumer([first, then])
    producer = FakeProducer()
    batches: list[list[str]] = []
    total = 3 + BULK_RECORDS + 4

    async def recorded(records: Sequence[Rec]) -> list[Handled]:
        batches.append(names(records))
        if "a0" in batches[-1]:
            # In flight until d's next record (polled with g's) is queued behind this batch.
            queued = cast(LaneLoop, loop)._queued_since
            while b"d" not in queued:  # noqa: ASYNC110 - the loop sets a plain field
                await asyncio.sleep(0.001)
        if sum(len(b) for b in batches) == total:
            consumer.done.set()
        return await handle(records)

    loop = make_loop(consumer, producer, handle=recorded, lane=by_tenant, lane_records=4)
    await asyncio.wait_for(loop.run(), timeout=10)
    grouped = [b for b in batches if not b[0].startswith("e")]
    # a, b, c and d (four records, the most a batch takes here) together; f then in a group
    # of its own; g (no batch in flight) and d's next record after the groups in flight.
    assert grouped == [["a0", "b1", "c2", "d0"], ["f1"], ["g80", "d2"]]
    # The backlog in slices of its own, in order, never with another lane's records.
    assert [n for b in batches if b[0].startswith("e") for n in b] == [
        f"e{10 + i}" for i in range(BULK_RECORDS)
    ]
    assert all(len(b) <= 4 and len({n[0] for n in b}) == 1 for b in batches if b[0] == "e")
    assert len(producer.on(Topic.OUTCOMES)) == total


async def test_a_slow_group_holds_the_other_lanes_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 46: the few-record lanes wait for a group in flight at most
    ``LANE_GROUP_WAIT_SECONDS`` (one tenant's slow provider does not hold the others'
    records): g's record starts while a's group is still in flight."""
    from runtime import loop as loop_module

    monkeypatch.setattr(loop_module, "LANE_GROUP_WAIT_SECONDS", 0.05)
    consumer = LaneConsumer([{TP: [few("a", 0)]}, {TP2: [few("g", 0, partition=1)]}])
    producer = FakeProducer()
    batches: list[list[str]] = []
    g_started = asyncio.Event()

    async def recorded(records: Sequence[Rec]) -> list[Handled]:
        batches.append(names(records))
        if batches[-1] == ["a0"]:
            await asyncio.wait_for(g_started.wait(), timeout=5)  # slow until g has started
            consumer.done.set()
        else:
            g_started.set()
        return await handle(records)

    loop = make_loop(consumer, producer, handle=recorded, lane=by_tenant)
    await asyncio.wait_for(loop.run(), timeout=10)
    assert batches == [["a0"], ["g0"]]
    assert len(producer.on(Topic.OUTCOMES)) == 2


async def test_a_busy_tenant_s_lanes_are_grouped_and_paced_apart_from_the_quiet_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 46 (CI at ca35e64: a quiet tenant's call waited 50 ms in the executor behind a
    flood's group): a tenant with ``BUSY_TENANT_RECORDS`` or more records in few-record lanes
    is grouped apart from the quiet tenants, and a quiet lane polled while the busy group is
    in flight starts at once (it waits only for the quiet groups in flight)."""
    from runtime import loop as loop_module
    from runtime.loop import BUSY_TENANT_RECORDS

    monkeypatch.setattr(loop_module, "LANE_GROUP_WAIT_SECONDS", 30.0)
    busy = [few("a", i) for i in range(BUSY_TENANT_RECORDS)]
    quiet = [few("b", 0, partition=1), few("c", 0, partition=1)]
    consumer = LaneConsumer([{TP: busy, TP2: quiet}, {TP2: [few("d", 5, partition=1)]}])
    producer = FakeProducer()
    batches: list[list[str]] = []
    d_handled = asyncio.Event()

    async def recorded(records: Sequence[Rec]) -> list[Handled]:
        batches.append(names(records))
        if "a0" in batches[-1]:
            await asyncio.wait_for(d_handled.wait(), timeout=5)  # in flight until d is done
            consumer.done.set()
        if "d5" in batches[-1]:
            d_handled.set()
        return await handle(records)

    loop = make_loop(consumer, producer, handle=recorded, lane=by_tenant)
    await asyncio.wait_for(loop.run(), timeout=10)
    assert batches == [[f"a{i}" for i in range(BUSY_TENANT_RECORDS)], ["b0", "c0"], ["d5"]]
    assert len(producer.on(Topic.OUTCOMES)) == BUSY_TENANT_RECORDS + 3


async def test_a_tenant_s_lanes_wait_for_its_groups_in_flight_of_either_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 46: a tenant's few-record lanes wait for every group in flight holding its
    records, quiet or busy, so a tenant alone (a one-tenant run, its load crossing
    ``BUSY_TENANT_RECORDS`` and back) has one chain of groups, never two overlapping."""
    from runtime import loop as loop_module
    from runtime.loop import BUSY_TENANT_RECORDS

    def partition_and_tenant(record: Rec) -> tuple[int, bytes]:
        return (record.partition, by_tenant(record))

    monkeypatch.setattr(loop_module, "LANE_GROUP_WAIT_SECONDS", 30.0)
    then = [few("a", 2 + i, partition=1) for i in range(BUSY_TENANT_RECORDS)]
    consumer = LaneConsumer([{TP: [few("a", 0), few("a", 1)]}, {TP2: then}])
    producer = FakeProducer()
    batches: list[list[str]] = []
    overlapped: list[bool] = []
    in_flight = 0
    lane_loop = cast(LaneLoop, None)

    async def recorded(records: Sequence[Rec]) -> list[Handled]:
        nonlocal in_flight
        batches.append(names(records))
        overlapped.append(in_flight > 0)
        in_flight += 1
        try:
            if batches[-1][0] == "a0":
                # In flight until a's busy lane, polled meanwhile, waits for it (or started).
                while lane_loop._group_due is None and len(batches) == 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
            if sum(len(b) for b in batches) == 2 + BUSY_TENANT_RECORDS:
                consumer.done.set()
            return await handle(records)
        finally:
            in_flight -= 1

    loop = make_loop(
        consumer,
        producer,
        handle=recorded,
        lane=partition_and_tenant,
        lane_tenant=lambda lane: lane[1],
    )
    lane_loop = cast(LaneLoop, loop)
    await asyncio.wait_for(loop.run(), timeout=10)
    assert batches == [["a0", "a1"], [f"a{2 + i}" for i in range(BUSY_TENANT_RECORDS)]]
    assert overlapped == [False, False]
    assert len(producer.on(Topic.OUTCOMES)) == 2 + BUSY_TENANT_RECORDS


def test_the_factory_picks_one_loop_per_mode_and_refuses_mixed_modes() -> None:
    """Issue 46: one small class per mode, chosen by ``consumer_loop``'s arguments."""
    consumer, producer = FakeConsumer([]), FakeProducer()
    assert type(make_loop(consumer, producer)) is BatchLoop
    assert type(make_loop(consumer, producer, lane=lambda r: r.partition)) is LaneLoop
    assert type(make_loop(consumer, producer, partition_records=10)) is PartitionLoop

    async def nothing() -> list[Handled]:
        return []

    for mixed in (
        {"lane": lambda r: r.partition, "tick": nothing},
        {"lane": lambda r: r.partition, "partition_records": 10},
        {"partition_records": 10, "tick": nothing},
        {"lane_records": 10},
        {"lane_tenant": lambda lane: lane},
        {"partition_records": 0},
    ):
        with pytest.raises(ValueError, match=r"take|without|at least"):
            make_loop(consumer, producer, **mixed)
