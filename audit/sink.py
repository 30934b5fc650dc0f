"""`ratifier audit sink`: every record of every pipeline topic into `audit_records`.

The runtime's consumer loop (runtime/loop.py) reads batches; each batch is written in one
PostgreSQL transaction with ``ON CONFLICT DO NOTHING`` on (topic, partition, offset), and
its offsets are committed only after that transaction commits. At-least-once delivery plus
an idempotent insert gives exactly one row per record. Nothing is skipped: a record that
cannot be read is stored as its hash and size; while PostgreSQL is away the batch is retried
and no offset moves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRecord
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from audit.masking import Masker, TokenVerifier
from audit.records import AuditRow, KafkaRecord, audit_row, unparseable
from commands.catalog import Catalog
from commands.sql import named_query
from config.settings import Settings
from runtime.clients import database_conninfo, kafka_consumer, pg_pool
from runtime.health import Health
from runtime.identity import context_keys, verify_context_token
from runtime.loop import ConsumerLoop, Handled, consumer_loop
from runtime.shell import UNAVAILABLE, ServiceShell, ShellWorker, StartupHook, run_until
from runtime.startup import open_pool
from schemas.envelopes import Actor
from schemas.errors import RatifierError
from schemas.names import AUDIT_SINK_GROUP, Topic
from telemetry.metrics import count_records

# How long one start-up attempt waits for PostgreSQL before the shell's backoff retries it.
CONNECT_TIMEOUT_SECONDS = 10.0

log = logging.getLogger("ratifier.audit")

_PKG = "audit"
# Every pipeline topic (the approval-join's internal expiry ticks went with faust, issue 44).
AUDITED_TOPICS: tuple[Topic, ...] = tuple(Topic)
PROGRESS_EVERY_SECONDS = 10.0


def max_audited_bytes(settings: Settings) -> int:
    """Records above this are stored as hash and size only (a dead letter of an oversized
    proposal is itself oversized)."""
    return 4 * settings.limits.max_record_bytes


def token_verifier(settings: Settings) -> TokenVerifier:
    """Verifies context and approver tokens (signature, audience, issuer; not expiry: the
    sink may read a record long after it was written). Without the expiry check the answer
    depends on the token alone, so it is cached: a call's proposed, validated and authorized
    records carry the same token, and an agent reuses one token for many calls."""
    keys = context_keys(settings)

    @functools.lru_cache(maxsize=4096)
    def verify(token: str) -> Actor | None:
        try:
            return verify_context_token(token, keys, check_expiry=False)
        except RatifierError:
            return None

    return verify


def kafka_record(record: ConsumerRecord[bytes, bytes]) -> KafkaRecord:
    return KafkaRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=int(record.timestamp),
        key=record.key,
        value=record.value,
        headers=tuple((str(name), bytes(value)) for name, value in record.headers or ()),
    )


class AuditSink(ShellWorker):
    """`ratifier audit sink`, in the service shell."""

    service = "audit-sink"
    # A database that refuses connections at start is waited for, like the broker.
    retry_on = (*UNAVAILABLE, psycopg.OperationalError, PoolTimeout)

    def __init__(self, settings: Settings, masker: Masker) -> None:
        self._settings = settings
        self._masker = masker
        self.stopping = asyncio.Event()
        self.written = 0  # rows inserted by this process
        self.seen = 0  # records consumed (duplicates of earlier deliveries included)
        self._loop: ConsumerLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reported = time.monotonic()
        self.health = Health.of("audit-sink", settings)

    def stop(self) -> None:
        self.stopping.set()
        if self._loop is not None:
            self._loop.stop()

    def rows(self, records: Sequence[KafkaRecord]) -> list[tuple[KafkaRecord, AuditRow]]:
        limit = max_audited_bytes(self._settings)
        prefix = self._settings.topic_prefix
        return [
            (r, audit_row(r, prefix=prefix, masker=self._masker, max_bytes=limit)) for r in records
        ]

    async def write(
        self, pool: AsyncConnectionPool[Any], rows: Sequence[tuple[KafkaRecord, AuditRow]]
    ) -> int:
        """Insert ``rows`` in one transaction; return how many were new. A row PostgreSQL
        refuses for its content is stored as its hash instead, in the same transaction."""
        query = named_query(_PKG, "insert_record")
        async with pool.connection() as conn, conn.transaction():
            try:
                async with conn.transaction(), conn.cursor() as cur:  # a savepoint
                    await cur.executemany(query, [row.params() for _, row in rows])
                    return max(int(cur.rowcount), 0)
            except psycopg.DataError:
                log.warning("a batch had rows PostgreSQL refused; writing them one by one")
            written = 0
            for record, row in rows:
                try:
                    async with conn.transaction(), conn.cursor() as cur:
                        await cur.execute(query, row.params())
                except psycopg.DataError:
                    hashed = replace(
                        row,
                        call_id=None,
                        tenant=None,
                        tool=None,
                        status=None,
                        trace_id=None,
                        record=json.dumps(unparseable(record.value)),
                    )
                    async with conn.transaction(), conn.cursor() as cur:
                        await cur.execute(query, hashed.params())
                written += max(int(cur.rowcount), 0)
            return written

    async def _handle(
        self, pool: AsyncConnectionPool[Any], records: Sequence[ConsumerRecord[bytes, bytes]]
    ) -> list[Handled]:
        """One batch into one transaction (the loop waits out PostgreSQL outages and commits
        the offsets only after this returns)."""
        batch = [kafka_record(r) for r in records]
        written = await self.write(pool, self.rows(batch))
        self.written += written
        self.seen += len(batch)
        count_records("audit", "written", written)
        count_records("audit", "duplicate", len(batch) - written)
        if time.monotonic() - self._reported >= PROGRESS_EVERY_SECONDS:
            self._reported = time.monotonic()
            self._progress()
        return [Handled(observe=False)] * len(records)

    def wire(self, shell: ServiceShell) -> None:
        """After ``prepare``: the database and the broker waited for (retried, not ready
        meanwhile); clients closed last."""
        shell.on_startup.append(StartupHook(name="database and broker", run=self._connect))
        shell.on_shutdown.append(self._close)

    async def _connect(self) -> None:
        settings = self._settings
        if self._pool is None:
            pool = pg_pool(database_conninfo(settings), max_size=2)
            self._pool = await open_pool(pool, wait_seconds=CONNECT_TIMEOUT_SECONDS)
        if self._consumer is None:
            topics = [settings.topic(t) for t in AUDITED_TOPICS]
            group = settings.group(AUDIT_SINK_GROUP)
            consumer = kafka_consumer(settings, *topics, group=group, max_poll_records=500)
            try:
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: the consumer loop until ``stop`` is set."""
        settings = self._settings
        assert self._pool is not None
        assert self._consumer is not None
        group = settings.group(AUDIT_SINK_GROUP)
        loop = self._loop = consumer_loop(
            settings,
            self._consumer,
            None,
            stage="audit",
            group=group,
            handle=partial(self._handle, self._pool),
            retry_on=(psycopg.OperationalError, PoolTimeout),
            poll_ms=500,
            max_records=500,
            health=self.health,
        )
        log.info(
            "audit sink started on %d topics under prefix %r",
            len(AUDITED_TOPICS),
            settings.topic_prefix,
        )
        await run_until(loop, stop)

    async def _close(self) -> None:
        self._progress(final=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._pool is not None:
            await self._pool.close()

    def _progress(self, *, final: bool = False) -> None:
        log.info(
            "audit sink %s: %d rows written, %d records seen (%d already recorded)",
            "stopping" if final else "progress",
            self.written,
            self.seen,
            self.seen - self.written,
        )


def run_audit_sink(
    settings: Settings, catalog: Catalog, prepare: Callable[[], Awaitable[None]] | None = None
) -> int:
    masker = Masker.for_catalog(catalog, salt=settings.audit_salt, verify=token_verifier(settings))
    sink = AuditSink(settings, masker)
    shell = sink.shell(
        prepare, http_port=settings.observability.audit_metrics_port, handle_signals=True
    )
    return asyncio.run(shell.run(sink.consume))
