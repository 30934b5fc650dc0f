"""What a worker opens in its start-up hooks (runtime/shell.py): a hook that fails leaves
nothing open, and its retry builds what failed anew (a half-started client holds
connections and tasks; a pool that never opened keeps reconnecting on its own)."""

from __future__ import annotations

from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from config.settings import Settings
from runtime.clients import kafka_consumer, kafka_producer, start_kafka_client
from schemas.errors import StorageUnavailable

# What a worker on PostgreSQL and Kafka meets while either is away: retried (at start by the
# shell, later by its own cycle), never a reason to exit.
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.Error,
    PoolTimeout,
    KafkaError,
    TimeoutError,
    OSError,
    StorageUnavailable,
)


async def open_pool(
    pool: AsyncConnectionPool[Any], *, wait_seconds: float
) -> AsyncConnectionPool[Any]:
    """``pool`` opened (its first connections made within ``wait_seconds``), or closed and the
    error raised."""
    try:
        await pool.open(wait=True, timeout=wait_seconds)
    except BaseException:
        await pool.close(timeout=1.0)
        raise
    return pool


class KafkaClients:
    """A service's producer and its consumer of ``topics`` in ``group``: ``start`` starts
    what has not started yet (a refused login raises ConfigurationError, which stops the
    start; the broker away raises what the shell retries), ``stop`` stops the consumer first."""

    def __init__(self, settings: Settings, *topics: str, group: str) -> None:
        self._settings = settings
        self._topics = topics
        self._group = group
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        settings = self._settings
        if self.producer is None:
            producer = kafka_producer(settings)
            await start_kafka_client(producer, settings.kafka)
            self.producer = producer
        if self.consumer is None:
            consumer = kafka_consumer(settings, *self._topics, group=self._group)
            await start_kafka_client(consumer, settings.kafka)
            self.consumer = consumer

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
