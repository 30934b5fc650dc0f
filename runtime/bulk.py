"""Records a handler publishes itself, already serialized: a flood's refusals.

The consumer loop publishes each record's output as an item of its own (runtime/publish.py):
a handful of objects, passes and checks per record, which were a third of the CPU of a
refused call. A handler whose output for many records is one small, ready record each (the
validator's refusals, streams/admission.py) hands them here instead: they go out in one batch
per topic-partition, and the handler learns, per record, whether its batch was acknowledged.
A record whose batch was not taken or not acknowledged is the handler's to answer the usual
way (its output handed to the loop, which retries, resends and dead-letters as for any
record): so nothing is lost, and a record is never refused because of another's fault. The
handler returns only after the acknowledgements, so the loop commits its offset only then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from config.settings import Settings
from runtime.batches import ProducerBatches
from runtime.partitioning import KeyPartitioner
from runtime.turns import turn
from schemas.names import TRACEPARENT_HEADER, Topic

# Records added to the batches before the event loop is given to other partitions' batches.
BUILD_YIELD_EVERY = 100


@dataclass(frozen=True, kw_only=True, slots=True)
class BulkRecord:
    """One ready record: its topic, key, JSON and the `traceparent` it carries (if any)."""

    topic: Topic
    key: str
    value: bytes
    traceparent: bytes | None


class BulkSend:
    """The batches of one :meth:`BulkRecords.send`, in flight."""

    def __init__(self, count: int, sent: list[tuple[Awaitable[Any] | None, list[int]]]) -> None:
        self._count = count
        self._sent = sent

    async def acknowledged(self) -> list[bool]:
        """Per record (in the order sent): whether its batch was acknowledged without error."""
        futures = [asyncio.ensure_future(ack) for ack, _ in self._sent if ack is not None]
        if futures:
            await asyncio.wait(futures)
        done = [True] * self._count
        acks = iter(futures)
        for ack, members in self._sent:
            future = next(acks) if ack is not None else None
            if future is None or future.cancelled() or future.exception() is not None:
                for member in members:
                    done[member] = False
        return done


class BulkRecords:
    """Ready records published through ``producer`` (a loop's bulk producer, started by its
    owner), partitioned by key as every producer of ratifier partitions them."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer, *, what: str) -> None:
        self._settings = settings
        self._producer = producer
        self._what = what
        self._partitioner = KeyPartitioner()
        self._names: dict[Topic, str] = {}

    async def send(self, records: Sequence[BulkRecord]) -> BulkSend:
        """Hand ``records`` to the producer (not waiting for acknowledgements)."""
        batches = ProducerBatches(self._producer, what=self._what)
        partitions: dict[str, list[int]] = {}
        for index, record in enumerate(records):
            if index % BUILD_YIELD_EVERY == BUILD_YIELD_EVERY - 1:
                await turn()  # other partitions' batches run meanwhile
            topic = self._names.get(record.topic)
            if topic is None:
                topic = self._names[record.topic] = self._settings.topic(record.topic)
            every = partitions.get(topic)
            if every is None:
                every = partitions[topic] = list(await self._producer.partitions_for(topic))
            key = record.key.encode()
            parent = record.traceparent
            batches.add(
                index,
                topic=topic,
                partition=self._partitioner(key, every, every),
                key=key,
                value=record.value,
                headers=[(TRACEPARENT_HEADER, parent)] if parent else [],
            )
        return BulkSend(len(records), await batches.send())
