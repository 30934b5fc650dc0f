"""Records a handler publishes itself (runtime/bulk.py): one batch per topic-partition, keys
partitioned as every producer of ratifier partitions them, and per record whether its batch
was acknowledged (an in-memory producer stands for Kafka's)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.errors import KafkaTimeoutError
from aiokafka.producer.message_accumulator import BatchBuilder

from config.settings import Settings
from runtime.bulk import BulkRecord, BulkRecords
from runtime.partitioning import KeyPartitioner
from schemas.names import TRACEPARENT_HEADER, Topic

PARTITIONS = [0, 1, 2, 3]


class MemoryProducer:
    """``create_batch``, ``send_batch`` and ``partitions_for`` of aiokafka's producer; the
    batches of ``failing`` partitions are refused (``refuse``) or fail on acknowledgement."""

    def __init__(self, *, failing: frozenset[int] = frozenset(), refuse: bool = False) -> None:
        self.sent: dict[tuple[str, int], list[tuple[bytes, bytes, Any]]] = {}
        self._failing = failing
        self._refuse = refuse

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16 * 1024, 0, is_transactional=False)

    async def partitions_for(self, topic: str) -> set[int]:
        return set(PARTITIONS)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        if partition in self._failing and self._refuse:
            raise KafkaTimeoutError
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if partition in self._failing:
            ack.set_exception(KafkaTimeoutError())
        else:
            records = [(r.key, r.value, r.headers) for r in _records_of(batch)]
            self.sent.setdefault((topic, partition), []).extend(records)
            ack.set_result(None)
        return ack


def _records_of(batch: BatchBuilder) -> list[Any]:
    from aiokafka.record.default_records import DefaultRecordBatch

    return list(DefaultRecordBatch(bytes(batch._build())))


def _records(n: int) -> list[BulkRecord]:
    return [
        BulkRecord(
            topic=Topic.OUTCOMES,
            key=f"call-{i}",
            value=b'{"call_id":"call-%d"}' % i,
            traceparent=b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01" if i % 2 else None,
        )
        for i in range(n)
    ]


def _partition(key: str) -> int:
    return int(KeyPartitioner()(key.encode(), PARTITIONS, PARTITIONS))


async def test_records_go_in_one_batch_per_partition_with_their_key_value_and_trace() -> None:
    producer = MemoryProducer()
    records = _records(40)
    bulk = BulkRecords(Settings(), producer, what="test")
    assert await (await bulk.send(records)).acknowledged() == [True] * 40
    topic = Settings().topic(Topic.OUTCOMES)
    for record in records:
        key = record.key.encode()
        (found,) = [r for r in producer.sent[(topic, _partition(record.key))] if r[0] == key]
        assert found[1] == record.value
        headers = [(TRACEPARENT_HEADER, record.traceparent)] if record.traceparent else []
        assert list(found[2]) == headers
    # In the order sent, within each partition.
    for (_, partition), sent in producer.sent.items():
        keys = [r.key.encode() for r in records if _partition(r.key) == partition]
        assert [r[0] for r in sent] == keys


async def test_a_record_whose_batch_fails_is_not_acknowledged_and_the_others_are() -> None:
    records = _records(40)
    for refuse in (False, True):  # failed on acknowledgement, or not taken at all
        producer = MemoryProducer(failing=frozenset({2}), refuse=refuse)
        bulk = BulkRecords(Settings(), producer, what="test")
        done = await (await bulk.send(records)).acknowledged()
        assert done == [_partition(r.key) != 2 for r in records]
        assert 0 < done.count(False) < len(records)
