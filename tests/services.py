"""Shared set-up for tests against the real local services (started by deploy/local/up)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from aiokafka import TopicPartition

from config.settings import DEVELOPMENT_MODE_ENV, Settings
from runtime.clients import kafka_admin, kafka_consumer, kafka_producer
from runtime.identity import context_keys, issue_context_token
from schemas.names import (
    AUTHORIZER_GROUP,
    EXECUTOR_GROUP,
    PIPELINE_TOPICS,
    STREAMS_APP_ID,
    VALIDATOR_GROUP,
    Topic,
)

T = TypeVar("T")

TEST_DATABASE_URL = os.environ.get(
    "RATIFIER_TEST_DATABASE_URL", "postgresql://ratifier:ratifier@127.0.0.1:5432/ratifier_test"
)


def reset_refundable(settings: Settings) -> None:
    """The test database outlives sessions: its payments get their full refundable amount back
    at the start of each one."""
    with psycopg.connect(settings.storage.database_url) as conn:
        conn.execute(
            "UPDATE payments SET refundable_minor = amount_minor "
            "WHERE payment_id IN ('pay_A1001', 'pay_A1002', 'pay_B2001')"
        )
        conn.execute("UPDATE payments SET refundable_minor = 2000 WHERE payment_id = 'pay_A1002'")


def session_settings(prefix: str | None = None) -> Settings:
    """Settings for one test session: its own topic prefix (so its own topics and consumer
    groups) and the test database."""
    return Settings(
        topic_prefix=prefix or f"t{uuid.uuid4().hex[:10]}.",
        storage={"database_url": TEST_DATABASE_URL},
        topic_partitions=4,
        development_mode=True,  # the built-in keys (docs/operations.md, "Development mode")
    )


def worker_env(settings: Settings) -> dict[str, str]:
    return {
        "RATIFIER_TOPIC_PREFIX": settings.topic_prefix,
        "RATIFIER_STORAGE__DATABASE_URL": settings.storage.database_url,
        "RATIFIER_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "RATIFIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "RATIFIER_STORAGE__REDIS_URL": settings.storage.redis_url,
        DEVELOPMENT_MODE_ENV: "true" if settings.development_mode else "false",
    }


def context_token(
    settings: Settings,
    tenant: str = "tenant-a",
    sub: str = "agent-1",
    roles: tuple[str, ...] = ("support",),
) -> str:
    return issue_context_token(context_keys(settings), sub=sub, tenant=tenant, roles=roles)


def bearer(
    settings: Settings, tenant: str, roles: tuple[str, ...] = (), *, sub: str = "ops-1"
) -> dict[str, str]:
    """An Authorization header carrying a context token of ``sub`` in ``tenant``."""
    return {"Authorization": f"Bearer {context_token(settings, tenant, sub, roles)}"}


def proposal(
    settings: Settings,
    *,
    tool: str,
    arguments: Any,
    tenant: str = "tenant-a",
    call_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "v": 1,
        "call_id": call_id or f"c-{uuid.uuid4().hex[:16]}",
        "tool": tool,
        "arguments": arguments,
        "context": context_token(settings, tenant=tenant),
        "proposed_at": datetime.now(UTC).isoformat(),
        **extra,
    }


def keyed_call(call_id: str, tool: str, arguments: dict[str, Any], key: str, ctx: str) -> bytes:
    """A `calls.proposed` record with its own idempotency key (load and chaos tests)."""
    return json.dumps(
        {
            "v": 1,
            "call_id": call_id,
            "idempotency_key": key,
            "tool": tool,
            "arguments": arguments,
            "context": ctx,
            "proposed_at": datetime.now(UTC).isoformat(),
        }
    ).encode()


async def publish(
    settings: Settings,
    records: Sequence[tuple[str | None, bytes | None]],
    topic: Topic = Topic.PROPOSED,
) -> None:
    producer = kafka_producer(settings)
    try:
        await producer.start()  # a broker away fails here: the producer is closed all the same
        for key, value in records:
            await producer.send(
                settings.topic(topic), key=key.encode() if key else None, value=value
            )
        await producer.flush()
    finally:
        await producer.stop()


async def read_until(
    settings: Settings,
    topics: list[Topic],
    done: Callable[[list[Any]], bool],
    timeout: float = 60.0,
) -> list[Any]:
    """Read ``topics`` from the beginning until ``done(records)`` holds; return the records.
    Raises TimeoutError naming what was seen when the condition does not hold in time."""
    consumer = kafka_consumer(settings, *(settings.topic(t) for t in topics), group=None)
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while not done(records):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"condition not met after {timeout}s; saw {len(records)} "
                    f"records on {[t.value for t in topics]}"
                )
            batches = await consumer.getmany(timeout_ms=300)
            for batch in batches.values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


def json_body(record: Any) -> dict[str, Any] | None:
    """The record's JSON object, or None for the poison records some tests publish."""
    try:
        body = json.loads(record.value)
    except (ValueError, TypeError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def outcomes_by_call(records: list[Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record.topic.endswith(Topic.OUTCOMES.value):
            body = json.loads(record.value)
            found.setdefault(body["call_id"], []).append(body)
    return found


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def read_to_end(settings: Settings, topics: list[Topic]) -> list[Any]:
    """Every record currently on ``topics`` (up to the end offsets seen at the start)."""
    consumer = kafka_consumer(settings, *(settings.topic(t) for t in topics), group=None)
    await consumer.start()
    records: list[Any] = []
    try:
        tps = sorted(consumer.assignment())
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, batch in batches.items():
                records.extend(r for r in batch if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return records
    finally:
        await consumer.stop()


# Every consumer group of the pipeline and its input topics.
PIPELINE_INPUTS = (
    (VALIDATOR_GROUP, Topic.PROPOSED),
    (AUTHORIZER_GROUP, Topic.VALIDATED),
    (STREAMS_APP_ID, Topic.AUTHORIZED),
    (STREAMS_APP_ID, Topic.APPROVALS_DECIDED),
    (EXECUTOR_GROUP, Topic.COMMITTED),
)


async def partitions_of(
    admin: Any, topics: Sequence[str], *, missing_ok: bool = False
) -> dict[str, list[TopicPartition]]:
    """Each topic's partitions, asked of the broker. A topic it does not know fails the
    caller's check (unless ``missing_ok``), rather than leaving it nothing to check."""
    known: dict[str, list[TopicPartition]] = {t: [] for t in topics}
    for described in await admin.describe_topics(list(topics)):
        name = described["topic"]
        if described["error_code"] == 0 and name in known:
            known[name] = [TopicPartition(name, p["partition"]) for p in described["partitions"]]
    unknown = [t for t, tps in known.items() if not tps]
    if unknown and not missing_ok:
        raise AssertionError(f"the broker knows no partitions of {unknown}")
    return known


async def commit_lag(
    settings: Settings, inputs: Sequence[tuple[str, Topic]], timeout: float = 45
) -> dict[str, int]:
    """Partitions whose group's committed offset is still behind the partition's end after
    ``timeout`` s, with their lag (empty when none): once every call is answered, every group
    must have committed everything it processed. A partition a group never committed counts
    as behind by its whole length."""
    pairs = {(settings.group(g), settings.topic(t)) for g, t in inputs}
    admin = kafka_admin(settings)
    consumer = kafka_consumer(settings, group=None)
    await admin.start()
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            # From the broker each time (a consumer without subscriptions knows no topic's
            # partitions: `consumer.topics()` does not fill its metadata, which once left this
            # check with nothing to check).
            known = await partitions_of(admin, sorted({t for _, t in pairs}))
            partitions = {(group, tp) for group, topic in pairs for tp in known[topic]}
            committed: dict[tuple[str, TopicPartition], int] = {}
            for group in {g for g, _ in pairs}:
                offsets = await admin.list_consumer_group_offsets(group)
                committed |= {(group, tp): meta.offset for tp, meta in offsets.items()}
            ends = await consumer.end_offsets([tp for _, tp in partitions])
            behind = {
                f"{group}:{tp.topic.removeprefix(settings.topic_prefix)}[{tp.partition}]": ends[tp]
                - max(committed.get((group, tp), 0), 0)
                for group, tp in partitions
                if ends[tp] > max(committed.get((group, tp), 0), 0)
            }
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(1)
    finally:
        await consumer.stop()
        await admin.close()


async def where_calls_are(
    settings: Settings, call_ids: set[str], topics: Sequence[Topic] = PIPELINE_TOPICS
) -> dict[str, dict[str, list[str]]]:
    """For each of ``call_ids``: the pipeline topics holding a record that names it, with each
    record's partition and offset. Read from the start of every topic: a diagnosis for a call
    that never ended (where did it stop?), printed by a failing test."""
    found: dict[str, dict[str, list[str]]] = {c: {} for c in call_ids}
    needles = {c: c.encode() for c in call_ids}
    admin = kafka_admin(settings)
    await admin.start()
    try:
        known = await partitions_of(admin, [settings.topic(t) for t in topics], missing_ok=True)
    finally:
        await admin.close()
    partitions = [tp for tps in known.values() for tp in tps]
    consumer = kafka_consumer(settings, group=None)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            positions = {tp: await consumer.position(tp) for tp in ends}
            if all(positions[tp] >= end for tp, end in ends.items()):
                break
            for tp, batch in (await consumer.getmany(timeout_ms=500)).items():
                name = tp.topic.removeprefix(settings.topic_prefix)
                for record in batch:
                    for call_id, needle in needles.items():
                        if needle in (record.key or b"") or needle in (record.value or b""):
                            found[call_id].setdefault(name, []).append(
                                f"{tp.partition}@{record.offset}"
                            )
        return found
    finally:
        await consumer.stop()
