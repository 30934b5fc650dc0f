from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from config.settings import Settings
from dashboard.server import create_app
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


@pytest.fixture(scope="module")
def own_settings(settings: Settings) -> Iterator[Settings]:
    """The settings on a topic prefix of the test module's own (its topics deleted after)."""
    own = settings.model_copy(update={"topic_prefix": f"o{uuid.uuid4().hex[:10]}."})
    run(ensure_topics(own))
    yield own
    run(delete_topics(own))


@pytest.fixture
async def dashboard(own_settings: Settings) -> AsyncIterator[TestClient[Any, Any]]:
    """The dashboard's HTTP API on ``own_settings``, in-process."""
    async with TestClient(TestServer(create_app(own_settings))) as test_client:
        yield test_client
