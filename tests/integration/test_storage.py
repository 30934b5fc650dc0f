from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from commands.payments.loaders import load_payment
from commands.payments.models import GetPaymentArguments
from ratifier.migrate import migrate
from schemas.envelopes import Actor
from schemas.settings import Settings

pytestmark = pytest.mark.integration


def test_migrate_is_idempotent_and_seeds_two_tenants(settings: Settings) -> None:
    assert migrate(settings.storage.database_url) == []
    with psycopg.connect(settings.storage.database_url) as conn:
        tenants = {r[0] for r in conn.execute("SELECT DISTINCT tenant FROM payments")}
        tables = {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert {"tenant-a", "tenant-b"} <= tenants
    assert {"payments", "refunds", "command_ledger", "audit_log", "schema_migrations"} <= tables


async def test_loader_keeps_tenant_in_where(pool: AsyncConnectionPool[Any]) -> None:
    args = GetPaymentArguments(payment_id="pay_B2001")
    async with pool.connection() as conn:
        assert await load_payment(conn, Actor(sub="u", tenant="tenant-a"), args, False) is None
        own = await load_payment(conn, Actor(sub="u", tenant="tenant-b"), args, False)
        locked = await load_payment(conn, Actor(sub="u", tenant="tenant-b"), args, True)
    assert own is not None and own.tenant == "tenant-b"
    assert own.attributes["currency"] == "USD"
    assert locked == own


def test_audit_log_is_append_only(settings: Settings) -> None:
    with psycopg.connect(settings.storage.database_url) as conn:
        conn.execute("INSERT INTO audit_log (kind) VALUES ('test')")
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("DELETE FROM audit_log WHERE kind = 'test'")
