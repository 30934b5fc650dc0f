"""The freezes in force in this process, followed from the compacted `controls` topic,
and the publishing of a freeze (docs/kill-switch.md). Which call a freeze stops is decided
by the pure `commands.freezes.frozen_scope`."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from aiokafka.errors import KafkaError
from pydantic import ValidationError

from commands.freezes import NO_FREEZES, Freezes, applied
from config.settings import Settings
from runtime.clients import kafka_producer, start_kafka_client
from runtime.reader import TopicReader
from schemas.envelopes import FreezeRecord
from schemas.errors import ConfigurationError, StorageUnavailable
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


async def publish_freeze(settings: Settings, record: FreezeRecord) -> datetime:
    """Publish ``record`` and wait for the broker's acknowledgement (all in-sync replicas);
    the wall-clock time it came, from which every stage refuses what the freeze stops.

    The producer is a one-shot (not idempotent: its one record, sent again by a retry, is the
    same record under the same key of a compacted topic), so the switch costs three round
    trips: metadata, produce, and nothing else. A `controls` topic that does not exist is a
    `ConfigurationError` at once, not aiokafka's 40 s of metadata retries and a traceback."""
    topic = settings.topic(Topic.CONTROLS)
    producer = kafka_producer(settings, enable_idempotence=False)
    try:
        await start_kafka_client(producer, settings.kafka)
    except KafkaError as exc:
        raise StorageUnavailable(
            f"Kafka at {settings.kafka_bootstrap} is not reachable ({exc}); nothing was "
            "published: the switch is NOT thrown"
        ) from exc
    try:
        await producer.client.add_topic(topic)
        if producer.client.cluster.partitions_for_topic(topic) is None:
            raise ConfigurationError(
                f"the brokers at {settings.kafka_bootstrap} have no topic {topic!r}: nothing "
                "follows freezes there (a wrong RATIFIER_TOPIC_PREFIX or cluster?); "
                "`ratifier topics` creates the topics"
            )
        await producer.send_and_wait(topic, key=record.scope.encode(), value=record.to_bytes())
        return datetime.now(UTC)
    except KafkaError as exc:
        raise StorageUnavailable(
            f"Kafka at {settings.kafka_bootstrap} did not acknowledge the record ({exc}); "
            "the switch may not be thrown: run the command again (the same record twice is "
            "harmless) and check `ratifier freezes`"
        ) from exc
    finally:
        await producer.stop()
