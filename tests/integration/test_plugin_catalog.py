"""A plugin catalog's own migrations (applied by `ratifier migrate`, recorded under its
name) and its actor-aware loader against real PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from commands.catalog import Catalog, load_catalog
from commands.reference import catalog as reference
from config.settings import Settings
from examples.helpdesk import GetTicketArguments, load_ticket
from ratifier.migrate import MIGRATIONS_DIR, _pending_files, migrate
from schemas.envelopes import Actor

pytestmark = pytest.mark.integration


def test_only_the_reference_catalog_brings_the_reference_seed() -> None:
    helpdesk = load_catalog("examples.helpdesk:catalog")
    reference_versions = [v for v, _ in _pending_files(MIGRATIONS_DIR, reference)]
    helpdesk_versions = [v for v, _ in _pending_files(MIGRATIONS_DIR, helpdesk)]
    assert "payments/0002_seed" in reference_versions
    assert "payments/0001_tables" in reference_versions
    assert not any("seed" in v for v in helpdesk_versions)
    assert "helpdesk/0001_tickets" in helpdesk_versions
    assert [v for v, _ in _pending_files(MIGRATIONS_DIR, Catalog([]))] == [
        v for v in reference_versions if "/" not in v
    ]


def test_a_plugins_migrations_are_applied_once_under_its_name(settings: Settings) -> None:
    migrate(settings.storage.database_url, catalog="examples.helpdesk:catalog")
    assert migrate(settings.storage.database_url, catalog="examples.helpdesk:catalog") == []
    with psycopg.connect(settings.storage.database_url) as conn:
        versions = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        tickets = conn.execute("SELECT count(*) FROM helpdesk_tickets").fetchone()
    assert "helpdesk/0001_tickets" in versions
    assert tickets is not None
    assert tickets[0] >= 3


async def test_a_foreign_ticket_loads_exactly_like_a_missing_one(settings: Settings) -> None:
    migrate(settings.storage.database_url, catalog="examples.helpdesk:catalog")
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.storage.database_url,
        min_size=1,
        max_size=1,
        open=False,
        kwargs={"row_factory": dict_row},
    )
    await pool.open(wait=True, timeout=10)
    try:
        async with pool.connection() as conn:
            carol = Actor(sub="carol", tenant="tenant-a")
            own = await load_ticket(conn, carol, GetTicketArguments(ticket_id="tkt_1"), False)
            foreign = await load_ticket(conn, carol, GetTicketArguments(ticket_id="tkt_2"), False)
            missing = await load_ticket(conn, carol, GetTicketArguments(ticket_id="tkt_9"), False)
            other = await load_ticket(
                conn,
                Actor(sub="carol", tenant="tenant-b"),
                GetTicketArguments(ticket_id="tkt_1"),
                False,
            )
            agent = Actor(sub="sam", tenant="tenant-a", roles=("support",))
            seen = await load_ticket(conn, agent, GetTicketArguments(ticket_id="tkt_2"), False)
    finally:
        await pool.close()
    assert own is not None
    assert own.attributes["opened_by_caller"] is True
    assert foreign is None
    assert missing is None
    assert other is None
    assert seen is not None
    assert seen.attributes["opened_by_caller"] is False
