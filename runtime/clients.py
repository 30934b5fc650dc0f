"""Every Kafka, Redis and PostgreSQL client of a ratifier service, built from Settings.

One place for what the delivery guarantees and the limits rest on: producers wait for all
in-sync replicas and are idempotent; consumers of a group commit by hand, read committed
records only, and leave a group 6 s after their process died (the broker's minimum), not
after the client default; every client may carry a record as large as a topic accepts
(``kafka_max_message_bytes``), so that a record the broker accepted can be fetched and
answered (docs/reliability.md, "Limits").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from config.settings import Settings

# How a Kafka client connects is shared with the agent client (one copy, in its distribution).
from ratifier_client.kafka import FileTokenProvider as FileTokenProvider
from ratifier_client.kafka import kafka_refusal as kafka_refusal
from ratifier_client.kafka import kafka_security as kafka_security
from ratifier_client.kafka import kafka_ssl_context as kafka_ssl_context
from ratifier_client.kafka import start_kafka_client as start_kafka_client
from ratifier_client.kafka import token_provider as token_provider
from runtime.partitioning import KeyPartitioner
from schemas.errors import ConfigurationError

if TYPE_CHECKING:
    # Imported where used: an operator's command that only publishes to Kafka (`ratifier
    # freeze`) does not load the PostgreSQL and Redis drivers (tests/unit/test_cli_imports.py).
    import psycopg
    from psycopg_pool import AsyncConnectionPool
    from redis.asyncio import Redis

log = logging.getLogger("ratifier.runtime")

# A crashed member's partitions move after 6 s rather than 10 (45 in newer clients): failover
# time is time records wait. Heartbeats at a quarter of it.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1500
# A few ms of linger lets the producer batch; without it every record is a request.
LINGER_MS = 2
# How long the broker may hold a fetch with nothing new (aiokafka's default). aiokafka sends
# one fetch per broker at a time and leaves out the partitions whose records are still
# buffered, so a record arriving on a partition just consumed can wait up to this long. 100 ms
# cut the raw 4-hop chain's p99 in four of four pairs but left the pipeline's idle p50 no
# better (worse in two of two, within the noise of a loaded machine): kept (bench/FLOORS.md).
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 52_428_800  # aiokafka's default: a whole poll
# How often the fetcher of a pipeline loop's consumer wakes when nothing else wakes it
# (aiokafka's `consumer_timeout_ms`, default 200; set by :func:`prompt_fetches`). Some changes
# reach it only then: positions set by the caller (a seek, a start), and a held partition
# whose records were taken while no fetch was in flight. With 200, a record could wait
# ~200 ms to be fetched: B's validator hop in a flood read 119 to 247 ms in one run of two,
# and a new consumer's first record ~203 ms in one of four; with 20, at most 15 ms and 28 ms
# (docs/operations.md, "Fair admission"). A wake costs ~0.2 ms of CPU (the fetcher plans
# every assigned partition): 10 ms per second for each consumer, so the followers of
# compacted topics and other side consumers keep aiokafka's 200.
FETCHER_WAKE_MS = 20
# A fetch sent while some partition's fetched records are still being handled (it leaves that
# partition out) waits at most this long on the broker, so that the partition is fetched
# again soon after (:func:`prompt_fetches`). Under a flood some partition is held nearly
# always, and a record arriving on a held partition waits for the fetch in flight (one per
# broker) to come back: with 20, B's command waited 8 to 21 ms in the executor's fetcher and
# B's slowest call in the flood took 28 to 68 ms; with 5, B's calls in the flood took no
# longer than alone (docs/measurements.md, "Held fetches, measured").
HELD_FETCH_WAIT_MS = 5
# The aiokafka releases whose fetcher :func:`prompt_fetches` was written for and is tested
# against (tests/integration/test_fetcher_pacing.py drives the real one): with any other it
# changes nothing and says so, and the pinned upgrade must first pass that test.
PACED_AIOKAFKA = frozenset({"0.14.0"})


def prompt_fetches(consumer: AIOKafkaConsumer) -> bool:
    """Fetch the other partitions at once while one partition's fetched records are still
    being handled (``consumer`` started; False, and nothing changed, when it is not, or when
    its aiokafka has not the parts this changes).

    aiokafka sends no fetch to a broker while any partition it leads has fetched records not
    yet taken, until 100 ms after they came (its ``prefetch_backoff``, not an option): a
    backlog being handled on one partition (one tenant's flood) held every other partition's
    next records up to 100 ms (docs/measurements.md, "The flood as the issue sends it"). Without
    that wait, the fetch that leaves the busy partition out held it in turn for up to the
    fetch's wait on the broker (500 ms) once its records were taken: so such a fetch waits
    :data:`HELD_FETCH_WAIT_MS` at most; a fetch of every partition waits as before. The
    fetcher also wakes every :data:`FETCHER_WAKE_MS`. Only with an aiokafka release of
    :data:`PACED_AIOKAFKA`."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:  # not started (or not aiokafka's)
        return False
    if aiokafka.__version__ not in PACED_AIOKAFKA:
        log.warning(
            "aiokafka %s is not one prompt_fetches was tested with (%s): fetches keep its "
            "default pacing",
            aiokafka.__version__,
            ", ".join(sorted(PACED_AIOKAFKA)),
        )
        return False
    plan = getattr(fetcher, "_get_actions_per_node", None)
    if (
        plan is None
        or not isinstance(getattr(fetcher, "_records", None), dict)
        or not isinstance(getattr(fetcher, "_fetch_max_wait_ms", None), int)
        or not isinstance(getattr(fetcher, "_fetcher_timeout", None), float)
    ):
        log.warning("aiokafka's fetcher is not as expected: fetches keep its default pacing")
        return False
    waits = fetcher._fetch_max_wait_ms

    def actions(assignment: Any) -> Any:
        held = any(tp in fetcher._records for tp in assignment.tps)
        fetcher._fetch_max_wait_ms = min(waits, HELD_FETCH_WAIT_MS) if held else waits
        return plan(assignment)

    fetcher._prefetch_backoff = 0
    fetcher._fetcher_timeout = FETCHER_WAKE_MS / 1000
    fetcher._get_actions_per_node = actions
    return True


def fetch_bytes(settings: Settings) -> int:
    """Per-partition fetch size: at least one whole record of the largest size a topic
    accepts, plus batch overhead."""
    return settings.limits.kafka_max_message_bytes + 64 * 1024


def kafka_consumer(
    settings: Settings, *topics: str, group: str | None, **options: Any
) -> AIOKafkaConsumer:
    """A consumer of ``topics``: in ``group`` (offsets committed by the caller), or without
    a group (the caller assigns or reads every partition)."""
    config: dict[str, Any] = {
        **kafka_security(settings.kafka),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": fetch_bytes(settings),
        "fetch_max_bytes": max(FETCH_MAX_BYTES, fetch_bytes(settings)),
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
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
        **kafka_security(settings.kafka),
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": LINGER_MS,
        "max_request_size": settings.limits.kafka_max_message_bytes,
        # The default partitioning, computed faster (runtime/partitioning.py).
        "partitioner": KeyPartitioner(),
    }
    return AIOKafkaProducer(**(config | options))


def kafka_admin(settings: Settings, **options: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**(kafka_security(settings.kafka) | options))


def redis_options(settings: Settings) -> dict[str, Any]:
    """The ACL user, password and TLS CA of ``settings``' Redis (the URL keeps the rest)."""
    options: dict[str, Any] = {}
    if settings.storage.redis_username is not None:
        options["username"] = settings.storage.redis_username
    if settings.storage.redis_password is not None:
        options["password"] = settings.storage.redis_password.get_secret_value()
    if settings.storage.redis_ssl_ca_file is not None:
        if not settings.storage.redis_url.startswith("rediss://"):
            raise ConfigurationError("redis_ssl_ca_file needs a rediss:// (TLS) redis_url")
        options["ssl_ca_certs"] = settings.storage.redis_ssl_ca_file
    return options


def redis_client(settings: Settings, *, timeout: float = 2.0) -> Redis:
    """A Redis client that gives up on a dead server after ``timeout`` seconds (callers treat
    Redis as a fast path and fall back), instead of hanging. TLS with a ``rediss://`` URL."""
    from redis.asyncio import Redis

    return Redis.from_url(
        settings.storage.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        **redis_options(settings),
    )


def database_conninfo(settings: Settings) -> str:
    """``database_url`` with ``database_sslmode`` / ``database_sslrootcert`` applied: what
    every PostgreSQL connection of a service connects with."""
    from psycopg.conninfo import make_conninfo

    extra = {
        "sslmode": settings.storage.database_sslmode,
        "sslrootcert": settings.storage.database_sslrootcert,
    }
    extra = {k: v for k, v in extra.items() if v is not None}
    return (
        make_conninfo(settings.storage.database_url, **extra)
        if extra
        else settings.storage.database_url
    )


def pg_options(
    *, dict_rows: bool = False, autocommit: bool = False, read_only: bool = False
) -> dict[str, Any]:
    """The connection options of every PostgreSQL connection and pool: rows as dicts,
    autocommit, and sessions that refuse writes (PostgreSQL enforces it, not our
    discipline)."""
    from psycopg.rows import dict_row

    options: dict[str, Any] = {"row_factory": dict_row} if dict_rows else {}
    if autocommit:
        options["autocommit"] = True
    if read_only:
        options["options"] = "-c default_transaction_read_only=on"
    return options


def pg_connect(conninfo: str, **options: bool) -> psycopg.Connection[Any]:
    """One (blocking) PostgreSQL connection on ``conninfo`` (:func:`database_conninfo`), for
    commands that run a few statements (migrations, `ratifier audit show`); ``options`` as
    :func:`pg_options`."""
    import psycopg

    return psycopg.connect(conninfo, **pg_options(**options))


async def pg_connect_async(conninfo: str, **options: bool) -> psycopg.AsyncConnection[Any]:
    """One asyncio PostgreSQL connection on ``conninfo``; ``options`` as :func:`pg_options`."""
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, **pg_options(**options))


def pg_pool(
    conninfo: str,
    *,
    max_size: int,
    min_size: int = 1,
    connect_timeout: float | None = None,
    check: bool = True,
    **options: bool,
) -> AsyncConnectionPool[Any]:
    """A PostgreSQL pool on ``conninfo`` (:func:`database_conninfo`), not opened yet
    (``await pool.open(wait=True, timeout=...)``); ``options`` as :func:`pg_options`. With
    ``connect_timeout``, a connection is waited for (and attempted) that long at most, and
    checked before it is handed out (``check``): a caller that must notice a database restart
    at once (not one dead connection at a time)."""
    from psycopg_pool import AsyncConnectionPool

    kwargs = pg_options(**options)
    if connect_timeout is None:
        return AsyncConnectionPool(
            conninfo, min_size=min_size, max_size=max_size, open=False, kwargs=kwargs
        )
    return AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        timeout=connect_timeout,
        check=AsyncConnectionPool.check_connection if check else None,
        kwargs=kwargs | {"connect_timeout": max(int(connect_timeout), 1)},
    )
