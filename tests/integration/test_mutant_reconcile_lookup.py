"""Reconciliation settles an unknown operation by asking the downstream, not by sending the
effect again (issue 43, `make mutants`): the provider applied the refund and lost its answer;
the reconciler's check of that one operation finds it with a lookup, and the provider sees no
second POST.

test_executor.py's lost-response test survives a reconciler that re-sends instead of looking
up: the fake provider is idempotent by key, so its applied count stays 1 either way, and it
runs the whole due queue (other sessions' unknown operations of this shared database), so it
cannot count POSTs. Here only our operation is checked."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from commands.reference import catalog
from commands.sql import named_query
from config.settings import Settings
from executors.claims import ClaimStore
from executors.executor import CommandExecutor
from executors.reconciler_store import Reconciler
from schemas.envelopes import Status
from tests.integration.test_executor import (
    POLICIES,
    REFUND,
    command,
    provider_faults,
    provider_stats,
    scalar,
)

pytestmark = pytest.mark.integration


async def test_an_applied_refund_whose_answer_was_lost_is_settled_by_a_lookup(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, provider_url: str
) -> None:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    try:
        executor = CommandExecutor(
            pool=pool,
            claims=ClaimStore(redis, prefix=settings.topic_prefix, owner="t-lookup"),
            catalog=catalog,
            policies=POLICIES,
            retry_attempts=2,
        )
        await provider_faults(provider_url, drop_after=1)
        lost = command("propose_refund", REFUND, roles=("refund",), approved=True)
        first = await executor.execute(lost, trace_id=None)
        assert first.unknown and first.outcome.status is Status.UNKNOWN
        assert (await provider_stats(provider_url))["posts"] == 1
        reconciler = Reconciler(pool=pool, catalog=catalog, attempts=3, backoff_base=0.1)
        async with pool.connection() as conn, conn.transaction():
            async with conn.cursor() as cur:
                await cur.execute(
                    named_query("executors", "unknown_for_update"),
                    {"tenant": lost.tenant, "operation_id": lost.operation_id},
                )
                row = await cur.fetchone()
            assert row is not None
            verdict = await reconciler.reconcile_row(conn, dict(row))
    finally:
        await catalog.stop()
    assert verdict.outcome is not None and verdict.outcome.status is Status.SUCCEEDED
    stats = await provider_stats(provider_url)
    assert stats["by_key"] == {lost.operation_id: 1}
    assert stats["posts"] == 1  # looked up, not sent again
    assert (
        await scalar(
            pool, "SELECT last_check FROM command_ledger WHERE operation_id = %s", lost.operation_id
        )
        == "applied downstream"
    )
