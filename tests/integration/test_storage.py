from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from commands.payments.loaders import load_payment
from commands.payments.models import GetPaymentArguments
from commands.reference import catalog
from config.settings import Settings
from ratifier.migrate import migrate
from schemas.envelopes import Actor
from streams.storage import StreamStorage

pytestmark = pytest.mark.integration

REFUND_PAYMENT_POLICY = ("propose_refund", "get_payment", "get_refund_policy")


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


async def test_stream_storage_loads_a_batch_in_order_and_in_each_tenant(
    settings: Settings,
) -> None:
    storage = StreamStorage(settings.storage.database_url)
    a, b = Actor(sub="u", tenant="tenant-a"), Actor(sub="u", tenant="tenant-b")
    refund, payment, policy = (catalog.get(n) for n in REFUND_PAYMENT_POLICY)
    assert refund is not None and payment is not None and policy is not None
    asks = [
        (payment, a, GetPaymentArguments(payment_id="pay_A1002")),
        (payment, a, GetPaymentArguments(payment_id="pay_B2001")),  # another tenant's
        (payment, b, GetPaymentArguments(payment_id="pay_B2001")),
        (policy, b, policy.arguments.model_validate({})),
        (payment, a, GetPaymentArguments(payment_id="pay_A1001")),
        (payment, a, GetPaymentArguments(payment_id="pay_A1002")),
        (
            refund,
            a,
            refund.arguments.model_validate(
                {"payment_id": "pay_A1001", "amount_minor": 1, "reason": "batch"}
            ),
        ),
    ]
    try:
        found = await storage.fetch_many(asks)
        one_by_one = [await storage.fetch(tool, who, args) for tool, who, args in asks]
    finally:
        await storage.close()
    assert found == one_by_one
    assert [(r.tenant, r.id) if r is not None else None for r in found] == [
        ("tenant-a", "pay_A1002"),
        None,
        ("tenant-b", "pay_B2001"),
        ("tenant-b", "tenant-b"),
        ("tenant-a", "pay_A1001"),
        ("tenant-a", "pay_A1002"),
        ("tenant-a", "pay_A1001"),
    ]
