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
            consumer = kafka_consumer(self._settings, *self._topics, group=None)
            try:
                await consumer.start()
                for tp in consumer.assignment():
                    if tp in self._positions:
                        consumer.seek(tp, self._positions[tp])
                    else:
                        await consumer.seek_to_beginning(tp)
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
