from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from config.settings import Settings
from ratifier.migrate import migrate
from ratifier.topics import delete_topics, ensure_topics
from runtime.clients import pg_pool, redis_client
from tests.services import reset_refundable, run, session_settings


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    settings = session_settings()
    migrate(settings.storage.database_url)
    reset_refundable(settings)
    yield settings
    run(delete_topics(settings))


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool = pg_pool(settings.storage.database_url, max_size=4, dict_rows=True)
    await pool.open(wait=True, timeout=10)
    yield pool
    await pool.close()


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = redis_client(settings)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def topics(settings: Settings) -> list[str]:
    return run(ensure_topics(settings))


@pytest.fixture
async def provider_url() -> AsyncIterator[str]:
    """The fake payment provider, in this process, on a free loopback port."""
    from testsupport.provider import bound_port, serve

    runner = await serve("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()
