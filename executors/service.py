"""`ratifier executor`: a consumer group on `commands.committed`.

Offsets are committed only after each outcome is recorded in the ledger and acknowledged by
the broker. Partitions are worked on concurrently, records within a partition in order.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from redis.asyncio import Redis

from commands.catalog import Catalog
from commands.policy_feed import PolicyFeed
from executors.dedup import OutcomeCache
from executors.executor import CommandExecutor
from schemas.envelopes import CommittedCommand, DeadLetter, Record, SourcePosition
from schemas.errors import StorageUnavailable
from schemas.names import EXECUTOR_GROUP, TRACEPARENT_HEADER, Topic
from schemas.settings import Settings

log = logging.getLogger("ratifier.executor")

RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


def _trace_id(record: ConsumerRecord[bytes, bytes]) -> str | None:
    for name, value in record.headers or ():
        if name == TRACEPARENT_HEADER:
            parts = bytes(value).decode(errors="replace").split("-")
            if len(parts) == 4:
                return str(parts[1])
    return None


class ExecutorService:
    def __init__(self, settings: Settings, *, catalog: Catalog, policies: PolicyFeed) -> None:
        self._settings = settings
        self._catalog = catalog
        self._policies = policies
        self._stopping = asyncio.Event()
        self.processed = 0

    def stop(self) -> None:
        self._stopping.set()

    async def _send(
        self,
        producer: AIOKafkaProducer,
        topic: Topic,
        key: str | None,
        value: Record,
        trace_id: str | None,
    ) -> asyncio.Future[Any]:
        headers = (
            [(TRACEPARENT_HEADER, f"00-{trace_id}-{'0' * 15}1-01".encode())] if trace_id else None
        )
        future: asyncio.Future[Any] = await producer.send(
            self._settings.topic(topic),
            key=key.encode() if key is not None else None,
            value=value.to_bytes(),
            headers=headers,
        )
        return future

    async def _handle(
        self,
        executor: CommandExecutor,
        producer: AIOKafkaProducer,
        record: ConsumerRecord[bytes, bytes],
    ) -> asyncio.Future[Any]:
        trace_id = _trace_id(record)
        try:
            command = CommittedCommand.model_validate_json(record.value or b"")
        except ValidationError:
            letter = DeadLetter(
                call_id=None,
                reason="executor: unreadable committed command",
                raw_base64=base64.b64encode(record.value or b"").decode(),
                source=SourcePosition(
                    topic=record.topic, partition=record.partition, offset=record.offset
                ),
                at=datetime.now(UTC),
            )
            return await self._send(producer, Topic.DEADLETTER, None, letter, trace_id)
        attempt = 0
        while True:
            try:
                outcome = await executor.execute(command, trace_id=trace_id)
                break
            except StorageUnavailable:
                # Nothing happened (the transaction rolled back): waiting is safe, skipping
                # would lose the command.
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                log.warning(
                    "storage unavailable for %s; retry in %.1fs", command.operation_id, delay
                )
                await asyncio.sleep(delay)
        return await self._send(producer, Topic.OUTCOMES, outcome.call_id, outcome, trace_id)

    async def _work_partition(
        self,
        executor: CommandExecutor,
        producer: AIOKafkaProducer,
        records: list[ConsumerRecord[bytes, bytes]],
    ) -> None:
        pending = [await self._handle(executor, producer, r) for r in records]
        await asyncio.gather(*pending)  # broker acknowledged every outcome

    async def run(self) -> None:
        settings = self._settings
        consumer = AIOKafkaConsumer(
            settings.topic(Topic.COMMITTED),
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=settings.group(EXECUTOR_GROUP),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=200,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=2,
        )
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.database_url,
            min_size=1,
            max_size=8,
            open=False,
            kwargs={"row_factory": dict_row},
        )
        redis = Redis.from_url(settings.redis_url)
        cache = OutcomeCache(
            redis, prefix=settings.topic_prefix, ttl_seconds=settings.outcome_cache_seconds
        )
        executor = CommandExecutor(
            pool=pool, cache=cache, catalog=self._catalog, policies=self._policies
        )
        await pool.open(wait=True, timeout=30)
        await producer.start()
        await consumer.start()
        follower = asyncio.create_task(self._policies.follow())
        log.info("executor started on %s", settings.topic(Topic.COMMITTED))
        try:
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=200)
                if not batches:
                    continue
                await asyncio.gather(
                    *(self._work_partition(executor, producer, recs) for recs in batches.values())
                )
                offsets = {
                    TopicPartition(tp.topic, tp.partition): recs[-1].offset + 1
                    for tp, recs in batches.items()
                }
                await consumer.commit(offsets)
                self.processed += sum(len(r) for r in batches.values())
        finally:
            log.info("executor stopping")
            follower.cancel()
            await consumer.stop()
            await producer.stop()
            await pool.close()
            await redis.aclose()


def run_executor(settings: Settings, *, catalog: Catalog, policies: PolicyFeed) -> None:
    service = ExecutorService(settings, catalog=catalog, policies=policies)

    async def main() -> None:
        await policies.catch_up()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop)
        await service.run()

    asyncio.run(main())
