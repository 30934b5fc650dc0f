"""The consumer loop with independent partitions (``partition_records``; the stateless
stages): a partition with a backlog does not delay another partition's records; each
partition's records stay in order and its offsets are committed after the
acknowledgements, only while assigned; a stop commits nothing not acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition

from runtime.loop import ConsumerLoop, Handled
from schemas.errors import StorageUnavailable
from schemas.names import Topic
from tests.unit.test_runtime_loop import (
    TP,
    TP2,
    FakeConsumer,
    FakeProducer,
    Rec,
    handle,
    rec,
)
from tests.unit.test_runtime_loop import make_loop as make_any_loop


class PartitionedConsumer(FakeConsumer):
    """Fetched records per partition, drained like aiokafka's fetcher (by the partitions
    asked for, up to ``max_records``); stops the loop once every record was handed out."""

    def __init__(self, records: dict[TopicPartition, list[Rec]]) -> None:
        super().__init__([])
        self.buffered = {tp: list(recs) for tp, recs in records.items()}
        self.assigned |= set(records)
        self.on_commit: dict[TopicPartition, asyncio.Event] = {}
        self.asked: list[int] = []

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[Rec]]:
        self.asked.append(max_records)
        if not any(self.buffered.values()):
            assert self.loop is not None
            self.loop.stop()
            await asyncio.sleep(0)
            return {}
        drained: dict[TopicPartition, list[Rec]] = {}
        for tp in partitions or tuple(self.buffered):
            records = self.buffered.get(tp, [])
            take, self.buffered[tp] = records[:max_records], records[max_records:]
            if take:
                drained[tp] = take
                max_records -= len(take)
            if max_records == 0:
                break
        if not drained:
            await asyncio.sleep(0.001)
        return drained

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await super().commit(offsets)
        for tp in offsets:
            if tp in self.on_commit:
                self.on_commit[tp].set()


def make_loop(
    consumer: PartitionedConsumer, producer: FakeProducer, **options: Any
) -> ConsumerLoop:
    options.setdefault("partition_records", 100)
    return make_any_loop(consumer, producer, **options)


def committed(consumer: PartitionedConsumer, tp: TopicPartition) -> list[int]:
    return [offsets[tp] for offsets in consumer.committed if tp in offsets]


async def test_a_partition_behind_a_backlog_is_not_waited_for() -> None:
    backlog = [rec(i, f"ok:a-{i}".encode()) for i in range(300)]
    consumer = PartitionedConsumer({TP: backlog, TP2: [rec(0, b"ok:b-0", partition=1)]})
    consumer.on_commit[TP2] = asyncio.Event()
    producer = FakeProducer()
    sizes: list[int] = []

    async def slow_backlog(records: Sequence[Rec]) -> list[Handled]:
        sizes.append(len(records))
        if records[0].partition == 0 and records[0].offset == 0:
            # The backlog's first batch ends only once the other partition's record is done:
            # a loop that took partitions in turn would never get there.
            await asyncio.wait_for(consumer.on_commit[TP2].wait(), 5)
        return await handle(records)

    loop = make_loop(consumer, producer, handle=slow_backlog)
    await loop.run()
    calls = [o["call_id"] for o in producer.on(Topic.OUTCOMES)]
    assert calls.index("b-0") < calls.index("a-0")
    # The backlog in order, one batch of at most 100 at a time; offsets committed after
    # the acknowledgements, never backwards, up to the end.
    assert [c for c in calls if c.startswith("a-")] == [f"a-{i}" for i in range(300)]
    assert sorted(sizes) == [1, 100, 100, 100]
    assert committed(consumer, TP) == sorted(committed(consumer, TP))
    assert committed(consumer, TP)[-1] == 300
    assert committed(consumer, TP2) == [1]
    assert loop.processed == 301
    assert max(consumer.asked) == 100


async def test_failures_stay_isolated_per_record_and_partition() -> None:
    consumer = PartitionedConsumer(
        {
            TP: [rec(0, b"ok:c-0"), rec(1, b'boom {"call_id": "c-boom"}'), rec(2, b"big:c-big")],
            TP2: [rec(7, b"ok:c-7", partition=1), rec(8, b"fail", partition=1)],
        }
    )
    producer = FakeProducer()
    loop = make_loop(consumer, producer)
    await loop.run()
    statuses = {o["call_id"]: o["status"] for o in producer.on(Topic.OUTCOMES)}
    assert statuses == {
        "c-0": "succeeded",
        "c-7": "succeeded",
        "c-boom": "failed",
        "c-fail": "failed",
        "c-big": "succeeded",
    }
    assert loop.dead_lettered == 3
    assert committed(consumer, TP)[-1] == 3
    assert committed(consumer, TP2)[-1] == 9


async def test_a_revoked_partition_is_not_committed_and_a_stop_commits_nothing() -> None:
    consumer = PartitionedConsumer({TP: [rec(0, b"ok:c-0")], TP2: [rec(0, b"ok:c-1", partition=1)]})
    producer = FakeProducer()

    async def revoking(records: Sequence[Rec]) -> list[Handled]:
        if records[0].partition == 1:
            consumer.assigned = {TP}  # a rebalance took partition 1 while it was handled
        return await handle(records)

    await make_loop(consumer, producer, handle=revoking).run()
    assert committed(consumer, TP) == [1]
    assert committed(consumer, TP2) == []
    assert len(producer.on(Topic.OUTCOMES)) == 2  # its new owner answers it again

    async def down(records: Sequence[Rec]) -> list[Handled]:
        loop.stop()
        raise StorageUnavailable()

    consumer, producer = PartitionedConsumer({TP: [rec(0, b"ok:c-0")]}), FakeProducer()
    loop = make_loop(consumer, producer, handle=down)
    await loop.run()
    assert consumer.committed == []
    assert producer.sent == []


def test_independent_partitions_take_no_tick() -> None:
    async def tick() -> list[Handled]:
        return []

    consumer = PartitionedConsumer({})
    try:
        make_loop(consumer, FakeProducer(), tick=tick)
    except ValueError:
        return
    raise AssertionError("a tick was accepted with independent partitions")
