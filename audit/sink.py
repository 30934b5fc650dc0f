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
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import psycopg
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from audit.masking import Masker, TokenVerifier
from audit.records import AuditRow, KafkaRecord, audit_row, unparseable
from commands.catalog import Catalog
from commands.sql import named_query
from config.settings import Settings
from runtime.clients import database_conninfo, kafka_consumer, pg_pool
from runtime.health import Health, serve_health
from runtime.identity import context_keys, verify_context_token
from runtime.loop import ConsumerLoop, Handled
from runtime.signals import stop_on_signals
from schemas.envelopes import Actor
from schemas.errors import RatifierError
from schemas.names import AUDIT_SINK_GROUP, Topic
from telemetry.metrics import count_records

log = logging.getLogger("ratifier.audit")

_PKG = "audit"
# Everything but the approval-join's internal expiry ticks (a clock nudge with no content;
# the expiry itself is on `outcomes` and in `audit_log`).
AUDITED_TOPICS: tuple[Topic, ...] = tuple(t for t in Topic if t is not Topic.APPROVAL_TIMERS)
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


class AuditSink:
    def __init__(self, settings: Settings, masker: Masker) -> None:
        self._settings = settings
        self._masker = masker
        self._stopping = asyncio.Event()
        self.written = 0  # rows inserted by this process
        self.seen = 0  # records consumed (duplicates of earlier deliveries included)
        self._loop: ConsumerLoop | None = None
        self._reported = time.monotonic()
        self.health = Health.of("audit-sink", settings)

    def stop(self) -> None:
        self._stopping.set()
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

    async def run(self) -> None:
        settings = self._settings
        topics = [settings.topic(t) for t in AUDITED_TOPICS]
        group = settings.group(AUDIT_SINK_GROUP)
        consumer = kafka_consumer(settings, *topics, group=group, max_poll_records=500)
        pool = pg_pool(database_conninfo(settings), max_size=2)
        loop = self._loop = ConsumerLoop(
            settings,
            consumer,
            None,
            stage="audit",
            group=group,
            handle=partial(self._handle, pool),
            retry_on=(psycopg.OperationalError, PoolTimeout),
            poll_ms=500,
            max_records=500,
            health=self.health,
        )
        if self._stopping.is_set():
            loop.stop()
        try:
            await pool.open(wait=True, timeout=30)
            await consumer.start()
            log.info(
                "audit sink started on %d topics under prefix %r",
                len(topics),
                settings.topic_prefix,
            )
            await loop.run()
        finally:
            self._progress(final=True)
            await consumer.stop()
            await pool.close()

    def _progress(self, *, final: bool = False) -> None:
        log.info(
            "audit sink %s: %d rows written, %d records seen (%d already recorded)",
            "stopping" if final else "progress",
            self.written,
            self.seen,
            self.seen - self.written,
        )


def run_audit_sink(settings: Settings, catalog: Catalog) -> None:
    masker = Masker.for_catalog(catalog, salt=settings.audit_salt, verify=token_verifier(settings))
    sink = AuditSink(settings, masker)

    async def main() -> None:
        stop_on_signals(sink.stop)
        close_metrics = await serve_health(
            settings.observability.metrics_host,
            settings.observability.audit_metrics_port,
            sink.health,
        )
        try:
            await sink.run()
        finally:
            await close_metrics()

    asyncio.run(main())
