"""The freezes in force in this process, followed from the compacted `controls` topic,
and the publishing of a freeze (docs/kill-switch.md). Which call a freeze stops is decided
by the pure `commands.freezes.frozen_scope`."""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from commands.freezes import NO_FREEZES, Freezes, applied
from config.settings import Settings
from runtime.clients import kafka_producer
from runtime.reader import TopicReader
from schemas.envelopes import FreezeRecord
from schemas.names import Topic

log = logging.getLogger("ratifier.freezes")


class FleetFreezes:
    """The freezes in force in this process, kept from the `controls` topic (every partition,
    from the beginning, then followed). A record is applied as soon as the reader gets it."""

    def __init__(self, settings: Settings) -> None:
        self._current = NO_FREEZES
        self._reader = TopicReader(settings, [Topic.CONTROLS], lambda _t, raw: self.apply(raw))

    @property
    def current(self) -> Freezes:
        return self._current

    def apply(self, raw: bytes | None) -> None:
        if raw is None:  # a tombstone: compaction's business, nothing to apply
            return
        try:
            record = FreezeRecord.model_validate_json(raw)
        except ValidationError:
            log.error("ignoring an unreadable controls record")
            return
        self._current = applied(self._current, record)
        log.warning(
            "%s %s by %s: %s",
            "FROZEN" if record.frozen else "unfrozen",
            record.scope,
            record.by,
            record.reason,
        )

    async def catch_up(self) -> None:
        """Read the topic to its current end (the consumer stays open for the next one)."""
        await self._reader.catch_up()

    async def follow(self, ready: asyncio.Event | None = None) -> None:
        """Catch up (then set ``ready``) and apply every new record until cancelled."""
        await self._reader.follow(ready)

    async def close(self) -> None:
        await self._reader.close()


async def publish_freeze(settings: Settings, record: FreezeRecord) -> None:
    """Publish ``record`` and wait for the broker's acknowledgement (all in-sync replicas)."""
    producer = kafka_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topic(Topic.CONTROLS), key=record.scope.encode(), value=record.to_bytes()
        )
    finally:
        await producer.stop()
