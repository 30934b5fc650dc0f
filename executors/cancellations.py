"""The calls withdrawn by the agent runtime (`calls.cancelled`), as every executor sees
them: all partitions, followed from the beginning (no consumer group)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from schemas.envelopes import CancelRequest
from schemas.names import Topic
from schemas.settings import Settings

log = logging.getLogger("ratifier.executor")
REMEMBERED = 1_000_000  # most recent cancellations kept; older calls have long executed


class CancelledCalls:
    """A bounded set of cancelled call ids (`in` checks it)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids

    def add(self, call_id: str) -> None:
        self._ids[call_id] = None
        while len(self._ids) > REMEMBERED:
            self._ids.popitem(last=False)

    def apply(self, raw: bytes | None) -> None:
        try:
            self.add(CancelRequest.model_validate_json(raw or b"").call_id)
        except ValidationError:
            log.warning("ignoring an unreadable calls.cancelled record")

    async def follow(self, ready: asyncio.Event | None = None) -> None:
        consumer = AIOKafkaConsumer(
            self._settings.topic(Topic.CANCELLED),
            bootstrap_servers=self._settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            tps = sorted(consumer.assignment())
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            while True:
                batches = await consumer.getmany(timeout_ms=200, max_records=5000)
                for records in batches.values():
                    for record in records:
                        self.apply(record.value)
                if ready is not None and not ready.is_set():
                    caught_up = True
                    for tp in tps:
                        if await consumer.position(tp) < ends[tp]:
                            caught_up = False
                    if caught_up:
                        ready.set()
        finally:
            await consumer.stop()
