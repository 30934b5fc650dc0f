"""`ratifier audit sink`: every record of every pipeline topic into `audit_records`.

A plain consumer group (auto-commit off) reads batches; each batch is written in one
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
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from audit.masking import Masker, TokenVerifier
from audit.records import AuditRow, KafkaRecord, audit_row, unparseable
from commands.catalog import Catalog
from commands.sql import named_query
from schemas.envelopes import Actor
from schemas.errors import RatifierError
from schemas.identity import context_keys, verify_context_token
from schemas.names import AUDIT_SINK_GROUP, Topic
from schemas.settings import Settings
from telemetry.metrics import count_records, refresh_consumer_lag, serve_metrics

log = logging.getLogger("ratifier.audit")

_PKG = "audit"
# Everything but the approval-join's internal expiry ticks (a clock nudge with no content;
# the expiry itself is on `outcomes` and in `audit_log`).
AUDITED_TOPICS: tuple[Topic, ...] = tuple(t for t in Topic if t is not Topic.APPROVAL_TIMERS)
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
PROGRESS_EVERY_SECONDS = 10.0
LAG_EVERY_SECONDS = 5.0


def max_audited_bytes(settings: Settings) -> int:
    """Records above this are stored as hash and size only (a dead letter of an oversized
    proposal is itself oversized)."""
    return 4 * settings.max_record_bytes


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

    def stop(self) -> None:
        self._stopping.set()

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

    async def _write_until_done(
        self, pool: AsyncConnectionPool[Any], rows: Sequence[tuple[KafkaRecord, AuditRow]]
    ) -> int | None:
        """Write ``rows``, waiting out PostgreSQL outages; None when stopped meanwhile."""
        attempt = 0
        while True:
            try:
                return await self.write(pool, rows)
            except (psycopg.OperationalError, PoolTimeout):
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                log.warning("audit store unavailable; retrying the batch in %.1fs", delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                except TimeoutError:
                    continue
                return None

    async def run(self) -> None:
        settings = self._settings
        topics = [settings.topic(t) for t in AUDITED_TOPICS]
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=settings.group(AUDIT_SINK_GROUP),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=500,
        )
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.database_url, min_size=1, max_size=2, open=False
        )
        reported = lagged = time.monotonic()
        group = settings.group(AUDIT_SINK_GROUP)
        try:
            await pool.open(wait=True, timeout=30)
            await consumer.start()
            log.info(
                "audit sink started on %d topics under prefix %r",
                len(topics),
                settings.topic_prefix,
            )
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=500)
                if time.monotonic() - lagged >= LAG_EVERY_SECONDS:
                    lagged = time.monotonic()
                    await refresh_consumer_lag(consumer, group)
                if not batches:
                    continue
                records = [kafka_record(r) for batch in batches.values() for r in batch]
                written = await self._write_until_done(pool, self.rows(records))
                if written is None:
                    break  # stopped while PostgreSQL was away: nothing committed, redelivered
                self.written += written
                self.seen += len(records)
                count_records("audit", "written", written)
                count_records("audit", "duplicate", len(records) - written)
                await self._commit(consumer, batches)
                if time.monotonic() - reported >= PROGRESS_EVERY_SECONDS:
                    reported = time.monotonic()
                    self._progress()
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

    @staticmethod
    async def _commit(
        consumer: AIOKafkaConsumer,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        assigned = consumer.assignment()
        offsets = {
            TopicPartition(tp.topic, tp.partition): recs[-1].offset + 1
            for tp, recs in batches.items()
            if tp in assigned and recs
        }
        try:
            if offsets:
                await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError):
            # A rebalance took these partitions away; their new owner redelivers them and the
            # primary key absorbs the duplicates.
            log.warning("offset commit failed after a rebalance; records will be redelivered")


def run_audit_sink(settings: Settings, catalog: Catalog) -> None:
    masker = Masker.for_catalog(catalog, salt=settings.audit_salt, verify=token_verifier(settings))
    sink = AuditSink(settings, masker)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sink.stop)
        close_metrics = await serve_metrics(settings.metrics_host, settings.audit_metrics_port)
        try:
            await sink.run()
        finally:
            await close_metrics()

    asyncio.run(main())
