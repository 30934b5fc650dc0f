"""The consumer loop's batched sends (``batched_sends``; the stateless stages): a batch's
outputs go out in one producer batch per topic-partition, on the partition the producer's
default partitioner gives each key, each record once; a batch refused as a whole costs only
the record that caused it (its companions go again alone, once), and offsets move only after
every acknowledgement."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import REGISTRY

from runtime.emit import Emit
from runtime.loop import BATCHED_RECORD_MAX, Handled
from schemas.names import TRACEPARENT_HEADER, Topic
from tests.unit.test_runtime_loop import (
    SETTINGS,
    TP,
    FakeConsumer,
    FakeProducer,
    Rec,
    answer,
    handle,
    make_loop,
    rec,
)

PARTITIONS = 12


class Builder:
    """A producer batch: takes ``room`` records, then says it is full."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.records: list[tuple[bytes, bytes, Any]] = []
        self.closed = False

    def append(self, *, timestamp: None, key: bytes, value: bytes, headers: Any) -> object:
        assert not self.closed
        if len(self.records) >= self.room:
            return None
        self.records.append((key, value, headers))
        return object()

    def close(self) -> None:
        self.closed = True


class BatchingProducer(FakeProducer):
    """``FakeProducer`` with aiokafka's batch interface; ``refuse_batches`` fails the
    acknowledgement of a batch holding a record whose value contains it (the broker refusing
    the batch for that record); ``lose_batches`` fails them transiently."""

    def __init__(self, room: int = 1000) -> None:
        super().__init__()
        self._partitioner = DefaultPartitioner()
        self.room = room
        self.batches: list[tuple[str, int, list[bytes]]] = []
        self.alone: list[bytes] = []
        self.refuse_batches: bytes | None = None
        self.lose_batches = False
        self.offered = 0  # batches handed over, acknowledged or not
        self.built: list[Builder] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    def create_batch(self) -> Builder:
        self.built.append(Builder(self.room))
        return self.built[-1]

    async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> Any:
        assert batch.closed
        self.offered += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        values = [value for _key, value, _headers in batch.records]
        if self.lose_batches:
            future.set_exception(KafkaTimeoutError("lost"))
        elif self.refuse_batches is not None and any(self.refuse_batches in v for v in values):
            future.set_exception(MessageSizeTooLargeError("broker refused the batch"))
        else:
            self.batches.append((topic, partition, [key for key, _v, _h in batch.records]))
            self.sent += [(topic, key, value) for key, value, _headers in batch.records]
            future.set_result(None)
        return future

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes, headers: Any
    ) -> asyncio.Future[Any]:
        self.alone.append(key or b"")
        return await super().send(topic, key=key, value=value, headers=headers)


def _outcome_ids(producer: FakeProducer) -> list[str]:
    return [json.loads(v)["call_id"] for t, _k, v in producer.sent if t.endswith("outcomes")]


async def test_a_batch_s_outputs_go_out_in_one_batch_per_partition_where_the_key_belongs() -> None:
    records = [rec(n, f"ok:c-{n}".encode()) for n in range(40)]
    consumer, producer = FakeConsumer([{TP: records}]), BatchingProducer(room=8)
    loop = make_loop(consumer, producer, batched_sends=True)
    await loop.run()

    assert sorted(_outcome_ids(producer)) == sorted(f"c-{n}" for n in range(40))
    assert producer.alone == []
    topic = SETTINGS.topic(Topic.OUTCOMES)
    every = list(range(PARTITIONS))
    for batch_topic, partition, keys in producer.batches:
        assert batch_topic == topic and 1 <= len(keys) <= 8
        assert all(DefaultPartitioner()(key, every, every) == partition for key in keys)
    # Full batches are sent and a new one started: fewer batches than records, more than
    # partitions only where a partition got more than a batch's room.
    assert len(producer.batches) < 40
    assert consumer.committed == [{TP: 40}]


async def test_a_batch_refused_for_one_record_costs_only_that_record() -> None:
    records = [rec(0, b"ok:c-0"), rec(1, b"ok:c-refused"), rec(2, b"ok:c-2"), rec(3, b"ok:c-3")]
    consumer, producer = FakeConsumer([{TP: records}]), BatchingProducer()
    producer.refuse_batches = b'"call_id":"c-refused"'
    producer.fail_acks = b'"call_id":"c-refused"'  # alone too, with its result
    loop = make_loop(consumer, producer, batched_sends=True)
    loop._partitioner = lambda _key, _all, _available: 0  # one batch holds every record
    await loop.run()

    assert producer.offered == 1 and producer.batches == []

    outcomes = producer.on(Topic.OUTCOMES)
    # Each of the others once (the refused batch wrote nothing), c-refused without result.
    assert sorted(o["call_id"] for o in outcomes) == ["c-0", "c-2", "c-3", "c-refused"]
    assert {o["call_id"]: o["result"] for o in outcomes}["c-refused"] is None
    (letter,) = producer.on(Topic.DEADLETTER)
    assert letter["source"]["offset"] == 1
    assert loop.dead_lettered == 1
    assert consumer.committed == [{TP: 4}]


async def test_lost_batches_are_resent_record_by_record_each_answered_alone() -> None:
    records = [rec(0, b"ok:c-0"), rec(1, b"big:c-big"), rec(2, b"ok:c-2")]
    consumer, producer = FakeConsumer([{TP: records}]), BatchingProducer()
    producer.lose_batches = True
    loop = make_loop(consumer, producer, batched_sends=True)
    await loop.run()

    outcomes = {o["call_id"]: o for o in producer.on(Topic.OUTCOMES)}
    assert sorted(outcomes) == ["c-0", "c-2", "c-big"]
    assert outcomes["c-big"]["result"] is None  # too large with it: refused alone
    assert producer.offered >= 1 and producer.batches == []
    assert sorted(producer.alone) == [b"c-0", b"c-2", b"c-big", b"c-big", b"c-big"]
    assert consumer.committed == [{TP: 3}]


async def test_without_the_default_partitioner_nothing_is_batched() -> None:
    consumer, producer = FakeConsumer([{TP: [rec(0, b"ok:c-0")]}]), BatchingProducer()
    producer._partitioner = object()
    await make_loop(consumer, producer, batched_sends=True).run()
    assert producer.offered == 0 and producer.alone == [b"c-0"]


async def test_an_item_with_a_record_too_large_to_batch_goes_alone_whole_each_record_once() -> None:
    consumer, producer = FakeConsumer([]), BatchingProducer()
    loop = make_loop(consumer, producer, batched_sends=True)
    small = Emit(topic=Topic.OUTCOMES, key="c-1", value=answer("c-1"))
    large = Emit(
        topic=Topic.OUTCOMES,
        key="c-1",
        value=answer("c-1").model_copy(update={"result": {"pad": "x" * BATCHED_RECORD_MAX}}),
    )
    alone = Emit(topic=Topic.OUTCOMES, key="c-2", value=answer("c-2"))
    acks = await loop._send_many(producer, [((small, large), None), ((alone,), None)])
    # Nothing of the first item went into a batch (it is sent alone, whole: no record twice);
    # the second did.
    assert acks[0] is None
    assert acks[1] is not None and len(acks[1]) == 1
    assert [keys for _topic, _partition, keys in producer.batches] == [[b"c-2"]]
    assert producer.offered == 1


async def test_bulk_items_go_out_through_the_bulk_producer_and_the_batch_waits_for_both() -> None:
    records = [rec(n, f"ok:c-{n}".encode()) for n in range(6)]

    async def marking(batch: Sequence[Any]) -> list[Handled]:
        done = await handle(batch)
        # Odd records are refusals of a flood: they go out through the bulk producer.
        return [replace(h, bulk=r.offset % 2 == 1) for r, h in zip(batch, done, strict=True)]

    consumer, producer, bulk = FakeConsumer([{TP: records}]), BatchingProducer(), BatchingProducer()
    loop = make_loop(consumer, producer, batched_sends=True, bulk_producer=bulk, handle=marking)
    await loop.run()

    assert sorted(_outcome_ids(producer)) == ["c-0", "c-2", "c-4"]
    assert sorted(_outcome_ids(bulk)) == ["c-1", "c-3", "c-5"]
    assert consumer.committed == [{TP: 6}]


async def test_bulk_refusals_are_counted_per_batch_and_carry_their_proposal_s_traceparent() -> None:
    """A flood's refusals (bulk, their metric status given) skip the per-record hop when no
    span exporter runs: counted per batch, the same totals as one by one; each output carries
    the consumed record's own `traceparent`."""
    parent = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    records = [
        Rec(TP.topic, 0, n, None, f"ok:c-{n}".encode(), ((TRACEPARENT_HEADER, parent),))
        for n in range(6)
    ]

    async def refusing(batch: Sequence[Any]) -> list[Handled]:
        done = await handle(batch)
        return [
            replace(h, bulk=True, status="rejected", code="rate_limited")
            if r.offset % 2 == 1
            else h
            for r, h in zip(batch, done, strict=True)
        ]

    def count(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    rejected = {"stage": "execute", "status": "rejected"}
    limited = {"stage": "execute", "code": "rate_limited"}
    succeeded = {"stage": "execute", "status": "succeeded"}
    before = [
        count("ratifier_records_total", rejected),
        count("ratifier_errors_total", limited),
        count("ratifier_records_total", succeeded),
        count("ratifier_stage_seconds_count", {"stage": "execute"}),
    ]
    consumer, producer, bulk = FakeConsumer([{TP: records}]), BatchingProducer(), BatchingProducer()
    loop = make_loop(consumer, producer, batched_sends=True, bulk_producer=bulk, handle=refusing)
    await loop.run()

    after = [
        count("ratifier_records_total", rejected),
        count("ratifier_errors_total", limited),
        count("ratifier_records_total", succeeded),
        count("ratifier_stage_seconds_count", {"stage": "execute"}),
    ]
    assert [b - a for a, b in zip(before, after, strict=True)] == [3, 3, 3, 6]
    assert sorted(_outcome_ids(bulk)) == ["c-1", "c-3", "c-5"]
    # The refusals carry the proposal's traceparent as it came; the others a hop of their own.
    theirs = [tuple(h) for b in bulk.built for _k, _v, h in b.records]
    assert theirs == [((TRACEPARENT_HEADER, parent),)] * 3
    others = [tuple(h) for b in producer.built for _k, _v, h in b.records]
    assert len(others) == 3 and ((TRACEPARENT_HEADER, parent),) not in others
    # A hop of their own: the proposal's trace, a new span.
    assert all(h[0][1].startswith(parent[:36]) for h in others)
    assert consumer.committed == [{TP: 6}]
