"""Read whole topics without a consumer group: from the beginning, then on.

Every process that keeps a view of a topic (the policy feed, the executors' cancelled calls,
the approver inbox) reads it the same way: every partition, from the start, applying each
record, either up to the ends as of now (catch up) or for as long as it runs (follow).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from config.settings import Settings
from runtime.clients import kafka_consumer
from schemas.names import Topic

log = logging.getLogger("ratifier.runtime")

Apply = Callable[[str, bytes | None], None]  # (topic name, record value)

# How long a reader's fetch may wait on the broker when there is nothing new. The broker
# answers a connection's requests in order, so a catch-up's offset requests (seek to the
# beginning, end offsets) wait behind the fetch in flight: with the services' 500 ms, an
# operator's `ratifier limits` spent a second waiting; with 100, a fifth of it. An idle
# reader sends 10 empty fetches a second instead of 2; a new record is delivered as soon as
# it arrives either way.
READER_FETCH_WAIT_MS = 100


class TopicReader:
    """One group-less consumer over ``topics``, opened on first use and kept until
    :meth:`close`, so that each catch-up reads only what is new. Positions survive
    :meth:`close`: a reader closed in one event loop resumes where it was in another."""

    def __init__(self, settings: Settings, topics: Sequence[Topic], apply: Apply) -> None:
        self._settings = settings
        self._topics = [settings.topic(t) for t in topics]
        self._apply = apply
        self._consumer: AIOKafkaConsumer | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._lock = asyncio.Lock()

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            # Subscribing without a group assigns every partition of the topics at start().
            consumer = kafka_consumer(
                self._settings, *self._topics, group=None, fetch_max_wait_ms=READER_FETCH_WAIT_MS
            )
            try:
                await consumer.start()
                new = [tp for tp in consumer.assignment() if tp not in self._positions]
                for tp in consumer.assignment():
                    if tp in self._positions:
                        consumer.seek(tp, self._positions[tp])
                # All at once: each offset request waits behind the fetch in flight on the
                # broker's connection (up to its wait), so one per partition made a reader
                # of a 12-partition topic take ~6 s to start (`ratifier limits`, issue 42).
                if new:
                    await consumer.seek_to_beginning(*new)
            except BaseException:
                # A consumer whose start failed still holds its client's sockets and tasks;
                # the caller retries with a new one.
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def _read(self, consumer: AIOKafkaConsumer, *tps: TopicPartition) -> None:
        batches = await consumer.getmany(*tps, timeout_ms=500, max_records=5000)
        for tp, records in batches.items():
            for record in records:
                try:
                    self._apply(tp.topic, record.value)
                except Exception:
                    # One record the view cannot take never stops the view from following.
                    log.exception("%s: record at offset %d skipped", tp, record.offset)
            if records:
                self._positions[tp] = records[-1].offset + 1

    async def catch_up(self) -> None:
        """Read every partition up to its end as of now (concurrent callers share one read)."""
        async with self._lock:
            consumer = await self._started()
            tps = sorted(consumer.assignment())
            ends = await consumer.end_offsets(tps) if tps else {}
            remaining = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
            while remaining:
                await self._read(consumer, *remaining)
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)

    async def follow(
        self, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
    ) -> None:
        """Catch up (then set ``ready``), and apply every new record until cancelled or until
        ``stop`` is set; the consumer is closed on the way out."""
        try:
            await self.catch_up()
            if ready is not None:
                ready.set()
            consumer = await self._started()
            while stop is None or not stop.is_set():
                async with self._lock:
                    await self._read(consumer)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
