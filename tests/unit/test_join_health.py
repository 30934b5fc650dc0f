"""The approval-join says it is not ready while its database is away, and ready again once a
step reaches it (streams/join_service.py): no I/O, the service is built but never started."""

from __future__ import annotations

import psycopg
import pytest

from commands.catalog import load_catalog
from config.settings import Settings
from feeds.policies import PolicyFeed, local_policies
from schemas.errors import StorageUnavailable
from streams.join_service import JoinService


async def test_the_join_is_not_ready_while_its_database_is_away() -> None:
    settings = Settings(development_mode=True)
    service = JoinService(
        settings, load_catalog(settings.catalog), PolicyFeed(settings, local_policies(settings))
    )
    service.health.running()

    async def away() -> None:
        raise psycopg.OperationalError("connection refused")

    async def back() -> str:
        return "done"

    with pytest.raises(StorageUnavailable):
        await service._guarded(away)
    ready, body = service.health.readiness()
    assert not ready and body["why"] == "database: OperationalError"
    assert await service._guarded(back) == "done"
    assert service.health.waiting is None
