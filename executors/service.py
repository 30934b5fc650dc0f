"""`ratifier executor`: a consumer group on `commands.committed`.

Offsets are committed only after each outcome is recorded in the ledger and acknowledged by
the broker. Partitions are worked on concurrently, records within a partition in order. On
SIGTERM the current batch is finished and its offsets committed; nothing unfinished is
committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from redis.asyncio import Redis

from commands.catalog import Catalog
from commands.policy_feed import PolicyFeed
from executors.cancellations import CancelledCalls
from executors.claims import ClaimStore
from executors.executor import CommandExecutor
from schemas.envelopes import CommittedCommand, DeadLetter, Outcome, Record, SourcePosition
from schemas.errors import StorageUnavailable
from schemas.names import EXECUTOR_GROUP, TRACEPARENT_HEADER, Topic
from schemas.settings import Settings
from telemetry.metrics import observe_record, refresh_consumer_lag, serve_metrics
from telemetry.tracing import (
    TraceParent,
    format_traceparent,
    new_trace_id,
    traceparent_of,
    tracer_from,
)

log = logging.getLogger("ratifier.executor")

RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
LAG_REFRESH_SECONDS = 5.0
POOL_SIZE = 8


def crash_hook(spec: str | None) -> Any:
    """Fault injection for crash tests: ``point:probability`` (e.g. ``after_effect:0.05``)
    kills this process with SIGKILL at that point. Off unless configured."""
    if not spec:
        return lambda _point: None
    point, _, rate = spec.partition(":")
    probability = float(rate or "1")

    def maybe_crash(at: str) -> None:
        if at == point and random.random() < probability:  # noqa: S311 - test fault, not crypto
            log.error("crash test: SIGKILL at %s", at)
            os.kill(os.getpid(), signal.SIGKILL)

    return maybe_crash


class ExecutorService:
    def __init__(self, settings: Settings, *, catalog: Catalog, policies: PolicyFeed) -> None:
        self._settings = settings
        self._catalog = catalog
        self._policies = policies
        self._stopping = asyncio.Event()
        self._crash = crash_hook(settings.executor_crash_at)
        self._tracer = tracer_from(settings, service="executor")
        self.processed = 0
        self._pool: AsyncConnectionPool[Any] | None = None
        # Commands in flight at once in this process (the pool has POOL_SIZE connections).
        self._concurrency = asyncio.Semaphore(POOL_SIZE * 2)

    def stop(self) -> None:
        self._stopping.set()

    async def _send(
        self,
        producer: AIOKafkaProducer,
        topic: Topic,
        key: str | None,
        value: Record,
        traceparent: bytes,
    ) -> asyncio.Future[Any]:
        headers = [(TRACEPARENT_HEADER, traceparent)]
        future: asyncio.Future[Any] = await producer.send(
            self._settings.topic(topic),
            key=key.encode() if key is not None else None,
            value=value.to_bytes(),
            headers=headers,
        )
        return future

    def _finished(
        self,
        *,
        trace_id: str,
        parent: TraceParent | None,
        started: int,
        status: str,
        code: str | None,
        call_id: str | None,
        tool: str | None,
    ) -> bytes:
        """Count the command, record its span; the `traceparent` of what it publishes."""
        ended = time.time_ns()
        observe_record("execute", status=status, code=code, seconds=(ended - started) / 1e9)
        span_id = self._tracer.record(
            stage="execute",
            trace_id=trace_id,
            parent=parent,
            start_ns=started,
            end_ns=ended,
            attributes={
                "ratifier.stage": "execute",
                "ratifier.status": status,
                "ratifier.error_code": code,
                "ratifier.call_id": call_id,
                "ratifier.tool": tool,
            }
            if self._tracer.enabled
            else {},
        )
        return format_traceparent(trace_id, span_id)

    async def _handle(
        self,
        executor: CommandExecutor,
        producer: AIOKafkaProducer,
        record: ConsumerRecord[bytes, bytes],
    ) -> list[asyncio.Future[Any]]:
        started = time.time_ns()
        parent = traceparent_of(record.headers)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        try:
            command = CommittedCommand.model_validate_json(record.value or b"")
        except ValidationError:
            letter = DeadLetter.of_raw(
                record.value,
                call_id=None,
                reason="executor: unreadable committed command",
                source=SourcePosition(
                    topic=record.topic, partition=record.partition, offset=record.offset
                ),
                at=datetime.now(UTC),
            )
            hop = self._finished(
                trace_id=trace_id,
                parent=parent,
                started=started,
                status="deadletter",
                code=None,
                call_id=None,
                tool=None,
            )
            return [await self._send(producer, Topic.DEADLETTER, None, letter, hop)]
        attempt = 0
        while True:
            try:
                done = await executor.execute(command, trace_id=trace_id)
                break
            except StorageUnavailable:
                # Nothing happened (the transaction rolled back): waiting is safe, skipping
                # would lose the command.
                if attempt == 0 and self._pool is not None:
                    # Connections that died while idle are all suspect: drop them at once
                    # and retry now, instead of one dead connection per backoff step.
                    await self._pool.check()
                    attempt += 1
                    continue
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                log.warning(
                    "storage unavailable for %s; retry in %.1fs", command.operation_id, delay
                )
                await asyncio.sleep(delay)
        outcome: Outcome = done.outcome
        if outcome.trace_id != trace_id:
            # A stored outcome answering a repeated call is published in that call's trace.
            outcome = outcome.model_copy(update={"trace_id": trace_id})
        hop = self._finished(
            trace_id=trace_id,
            parent=parent,
            started=started,
            status=outcome.status.value,
            code=outcome.error.code.value if outcome.error is not None else None,
            call_id=outcome.call_id,
            tool=outcome.tool,
        )
        sent = [await self._send(producer, Topic.OUTCOMES, outcome.call_id, outcome, hop)]
        if done.unknown:
            sent.append(
                await self._send(producer, Topic.UNKNOWN, command.operation_id, command, hop)
            )
        return sent

    async def _work_partition(
        self,
        executor: CommandExecutor,
        producer: AIOKafkaProducer,
        records: list[ConsumerRecord[bytes, bytes]],
    ) -> None:
        # Records of one key (operation id) run in order; different keys of the partition
        # run concurrently, bounded by the connection pool. One at a time, a partition's
        # throughput was one command per ledger round-trip chain (~10 round trips and a
        # commit), whatever PostgreSQL could do in parallel.
        by_key: dict[bytes | None, list[ConsumerRecord[bytes, bytes]]] = {}
        for record in records:
            by_key.setdefault(record.key, []).append(record)

        async def in_order(same_key: list[ConsumerRecord[bytes, bytes]]) -> list[Any]:
            async with self._concurrency:
                return [f for r in same_key for f in await self._handle(executor, producer, r)]

        sent = [f for fs in await asyncio.gather(*map(in_order, by_key.values())) for f in fs]
        await asyncio.gather(*sent)  # the broker acknowledged every outcome

    async def _keep_alive(self, claims: ClaimStore) -> None:
        """Refresh this executor's liveness mark, so that when it dies its claims are taken
        over within ``liveness_ms`` instead of after their lease."""
        while not self._stopping.is_set():
            await claims.heartbeat()
            await asyncio.sleep(claims.liveness_ms / 5000)

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
            # A crashed executor's partitions move after 6 s (the broker's minimum) rather
            # than 10: failover time is time commands wait.
            session_timeout_ms=6000,
            heartbeat_interval_ms=1500,
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
            max_size=POOL_SIZE,
            open=False,
            kwargs={"row_factory": dict_row},
        )
        redis = Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        claims = ClaimStore(
            redis,
            prefix=settings.topic_prefix,
            owner=owner,
            lease_ms=settings.claim_lease_seconds * 1000,
        )
        cancelled = CancelledCalls(settings)
        executor = CommandExecutor(
            pool=pool,
            claims=claims if settings.redis_fast_path else None,
            catalog=self._catalog,
            policies=self._policies,
            cancelled=cancelled,
            retry_attempts=settings.retry_attempts,
            crash=self._crash,
            wait_for_owner_seconds=settings.claim_lease_seconds,
        )
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        await self._catalog.start(settings)
        await producer.start()
        cancellations_ready = asyncio.Event()
        followers = [
            asyncio.create_task(self._policies.follow()),
            asyncio.create_task(cancelled.follow(cancellations_ready)),
        ]
        await asyncio.wait_for(cancellations_ready.wait(), timeout=60)
        await claims.heartbeat()
        followers.append(asyncio.create_task(self._keep_alive(claims)))
        await consumer.start()
        close_metrics = await serve_metrics(settings.metrics_host, settings.executor_metrics_port)
        group = settings.group(EXECUTOR_GROUP)
        lag_due = 0.0
        log.info("executor %s started on %s", owner, settings.topic(Topic.COMMITTED))
        try:
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=200)
                if time.monotonic() >= lag_due:
                    lag_due = time.monotonic() + LAG_REFRESH_SECONDS
                    await refresh_consumer_lag(consumer, group)
                if not batches:
                    continue
                await asyncio.gather(
                    *(self._work_partition(executor, producer, recs) for recs in batches.values())
                )
                self._crash("after_publish")
                assigned = consumer.assignment()
                offsets = {
                    TopicPartition(tp.topic, tp.partition): recs[-1].offset + 1
                    for tp, recs in batches.items()
                    if tp in assigned
                }
                try:
                    if offsets:
                        await consumer.commit(offsets)
                except (CommitFailedError, IllegalStateError):
                    # A rebalance took these partitions away; their new owner redelivers, and
                    # the ledger answers the duplicates.
                    log.warning(
                        "offset commit failed after a rebalance; records will be redelivered"
                    )
                self.processed += sum(len(r) for r in batches.values())
        finally:
            log.info("executor stopping")
            for task in followers:
                task.cancel()
            await consumer.stop()
            await producer.stop()
            await self._catalog.stop()
            await pool.close()
            await redis.aclose()
            await close_metrics()
            self._tracer.shutdown()


def run_executor(settings: Settings, *, catalog: Catalog, policies: PolicyFeed) -> None:
    service = ExecutorService(settings, catalog=catalog, policies=policies)

    async def main() -> None:
        await policies.catch_up()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop)
        await service.run()

    asyncio.run(main())
