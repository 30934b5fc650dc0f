"""Every Kafka, Redis and PostgreSQL client of a ratifier service, built from Settings.

One place for what the delivery guarantees and the limits rest on: producers wait for all
in-sync replicas and are idempotent; consumers of a group commit by hand, read committed
records only, and leave a group 6 s after their process died (the broker's minimum), not
after the client default; every client may carry a record as large as a topic accepts
(``kafka_max_message_bytes``), so that a record the broker accepted can be fetched and
answered (docs/reliability.md, "Limits").
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from schemas.settings import Settings

# A crashed member's partitions move after 6 s rather than 10 (45 in newer clients): failover
# time is time records wait. Heartbeats at a quarter of it.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1500
# A few ms of linger lets the producer batch; without it every record is a request.
LINGER_MS = 2
FETCH_MAX_BYTES = 52_428_800  # aiokafka's default: a whole poll


def fetch_bytes(settings: Settings) -> int:
    """Per-partition fetch size: at least one whole record of the largest size a topic
    accepts, plus batch overhead."""
    return settings.kafka_max_message_bytes + 64 * 1024


def kafka_consumer(
    settings: Settings, *topics: str, group: str | None, **options: Any
) -> AIOKafkaConsumer:
    """A consumer of ``topics``: in ``group`` (offsets committed by the caller), or without
    a group (the caller assigns or reads every partition)."""
    config: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": fetch_bytes(settings),
        "fetch_max_bytes": max(FETCH_MAX_BYTES, fetch_bytes(settings)),
    }
    if group is not None:
        config |= {
            "isolation_level": "read_committed",
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
        }
    return AIOKafkaConsumer(*topics, **(config | options))


def kafka_producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """A producer that waits for every in-sync replica, idempotent, with a short linger."""
    config: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": LINGER_MS,
        "max_request_size": settings.kafka_max_message_bytes,
    }
    return AIOKafkaProducer(**(config | options))


def kafka_admin(settings: Settings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)


def redis_client(settings: Settings, *, timeout: float = 2.0) -> Redis:
    """A Redis client that gives up on a dead server after ``timeout`` seconds (callers treat
    Redis as a fast path and fall back), instead of hanging."""
    return Redis.from_url(
        settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
    )


def pg_pool(
    database_url: str,
    *,
    max_size: int,
    min_size: int = 1,
    dict_rows: bool = False,
    autocommit: bool = False,
) -> AsyncConnectionPool[Any]:
    """A PostgreSQL pool, not opened yet (``await pool.open(wait=True, timeout=...)``)."""
    kwargs: dict[str, Any] = {"row_factory": dict_row} if dict_rows else {}
    if autocommit:
        kwargs["autocommit"] = True
    return AsyncConnectionPool(
        database_url, min_size=min_size, max_size=max_size, open=False, kwargs=kwargs
    )
