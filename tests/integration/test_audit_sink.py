from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from psycopg_pool import AsyncConnectionPool

from audit.masking import Masker
from audit.sink import AuditSink, kafka_record
from config.settings import Settings
from runtime.clients import kafka_consumer
from schemas.names import AUDIT_SINK_GROUP, TRACEPARENT_HEADER, Topic

pytestmark = pytest.mark.integration

SECRET = "DE44500105175407324931"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _records(settings: Settings) -> list[tuple[Topic, bytes | None, bytes, list[Any]]]:
    now = datetime.now(UTC).isoformat()
    proposal = {
        "v": 1,
        "call_id": "sink-proposed",
        "tool": "add_payout_account",
        "arguments": {"payment_id": "pay_A1001", "account_number": SECRET},
        "context": "not-a-token",
        "proposed_at": now,
    }
    outcome = {
        "v": 1,
        "call_id": "sink-outcome",
        "tool": "get_payment",
        "tenant": "tenant-a",
        "status": "denied",
        "stage": "authorize",
        "error": {"code": "not_found", "message": "x", "retryable": False, "fields": []},
        "at": now,
    }
    letter = {
        "v": 1,
        "call_id": None,
        "reason": "validator: unreadable",
        "raw_base64": base64.b64encode(
            b'{"call_id": "x", "arguments": "{\\"account_number\\": \\"' + SECRET.encode() + b'"'
        ).decode(),
        "source": {"topic": "t", "partition": 0, "offset": 1},
        "at": now,
    }
    header = [(TRACEPARENT_HEADER, f"00-{TRACE}-00f067aa0ba902b7-01".encode())]
    return [
        (Topic.PROPOSED, b"sink-proposed", json.dumps(proposal).encode(), []),
        (Topic.OUTCOMES, b"sink-outcome", json.dumps(outcome).encode(), header),
        (Topic.DEADLETTER, None, json.dumps(letter).encode(), []),
        (Topic.PROPOSED, b"garbage", b"\xff\xfe not json " + SECRET.encode(), []),
        (Topic.PROPOSED, b"nul", b'{"call_id": "nul\\u0000", "arguments": {}}', []),
        (
            Topic.PROPOSED,
            b"big",
            b'{"pad": "' + b"x" * (5 * settings.limits.max_record_bytes) + b'"}',
            [],
        ),
    ]


async def _publish(settings: Settings) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", max_request_size=2**21
    )
    await producer.start()
    try:
        for topic, key, value, headers in _records(settings):
            await producer.send_and_wait(
                settings.topic(topic), key=key, value=value, headers=headers
            )
    finally:
        await producer.stop()


def _rows(settings: Settings) -> list[dict[str, Any]]:
    with psycopg.connect(settings.storage.database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT * FROM audit_records WHERE prefix = %s ORDER BY topic, kafka_offset",
            (settings.topic_prefix,),
        ).fetchall()


async def _run_until(sink: AuditSink, done: Any, timeout: float = 40) -> None:
    task = asyncio.create_task(sink.run())
    deadline = time.monotonic() + timeout
    try:
        while not await asyncio.to_thread(done):
            assert not task.done(), "the sink stopped by itself"
            assert time.monotonic() < deadline, "the sink did not write the records in time"
            await asyncio.sleep(0.2)
    finally:
        sink.stop()
        await asyncio.wait_for(task, timeout=20)


async def _replay(settings: Settings) -> list[Any]:
    consumer = kafka_consumer(
        settings,
        *(settings.topic(t) for t in (Topic.PROPOSED, Topic.OUTCOMES, Topic.DEADLETTER)),
        group=None,
    )
    await consumer.start()
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 6 and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=300)).values():
                seen.extend(batch)
    finally:
        await consumer.stop()
    return seen


@pytest.mark.timeout(120)
async def test_sink_records_everything_once_masked(
    settings: Settings, topics: list[str], pool: AsyncConnectionPool[Any]
) -> None:
    await _publish(settings)
    masker = Masker(secret_names=frozenset({"accountnumber"}), salt="test-salt")
    sink = AuditSink(settings, masker)
    await _run_until(sink, lambda: len(_rows(settings)) >= 6)
    rows = _rows(settings)
    assert len(rows) == 6
    assert sink.written == 6
    assert SECRET not in json.dumps([r["record"] for r in rows])
    by_key = {r["record_key"]: r for r in rows}

    proposed = by_key["sink-proposed"]
    assert proposed["stream"] == "calls.proposed"
    assert proposed["call_id"] == "sink-proposed"
    assert proposed["record"]["arguments"]["account_number"].startswith("sha256:")
    assert proposed["record"]["arguments"]["payment_id"] == "pay_A1001"

    outcome = by_key["sink-outcome"]
    assert (outcome["tenant"], outcome["status"], outcome["error_code"]) == (
        "tenant-a",
        "denied",
        "not_found",
    )
    assert outcome["trace_id"] == TRACE

    letter = next(r for r in rows if r["stream"] == "calls.deadletter")
    assert letter["error_code"] == "malformed"
    assert "raw_base64" not in letter["record"]
    assert letter["record"]["raw"] is None  # not JSON: hash and size only
    assert letter["record"]["raw_bytes"] > 0

    for key in ("garbage", "nul", "big"):
        stored = by_key[key]["record"]
        assert stored["unparseable"] is True, key
        assert len(stored["sha256"]) == 64
        assert stored["bytes"] > 0

    # Replaying the same offsets writes nothing new.
    replayed = [kafka_record(r) for r in await _replay(settings)]
    assert len(replayed) == 6
    assert await sink.write(pool, sink.rows(replayed)) == 0
    assert len(_rows(settings)) == 6

    # Offsets were committed after the rows: the group's position is the end of each topic.
    assert await _committed_equals_end(settings)


async def _committed_equals_end(settings: Settings) -> bool:
    consumer = kafka_consumer(settings, group=settings.group(AUDIT_SINK_GROUP))
    await consumer.start()
    try:
        tps = [
            TopicPartition(settings.topic(t), p)
            for t in (Topic.PROPOSED, Topic.OUTCOMES, Topic.DEADLETTER)
            for p in range(settings.topic_partitions)
        ]
        ends = await consumer.end_offsets(tps)
        committed = {tp: await consumer.committed(tp) or 0 for tp in tps}
        return bool(committed == ends)
    finally:
        await consumer.stop()


def test_audit_records_are_append_only(settings: Settings) -> None:
    with psycopg.connect(settings.storage.database_url) as conn:
        conn.execute(
            "INSERT INTO audit_records (topic, kafka_partition, kafka_offset, prefix, stream, "
            "record_at, record) VALUES (%s, 0, 0, %s, 'outcomes', now(), '{}')",
            (settings.topic_prefix + "append-only", settings.topic_prefix + "append-only."),
        )
        conn.commit()
        for statement in (
            "UPDATE audit_records SET record = '{\"x\": 1}' WHERE topic = %s",
            "DELETE FROM audit_records WHERE topic = %s",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement, (settings.topic_prefix + "append-only",))
            conn.rollback()
