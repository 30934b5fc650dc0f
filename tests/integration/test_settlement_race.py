"""Executor and reconciler settle the same operation at once: one settlement, one effect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from commands.reference import catalog
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


@pytest.fixture
async def started_catalog(settings: Settings, provider_url: str) -> AsyncIterator[None]:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    yield
    await catalog.stop()


def executor(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, owner: str
) -> CommandExecutor:
    claims = ClaimStore(redis, prefix=settings.topic_prefix, owner=owner, lease_ms=300)
    return CommandExecutor(
        pool=pool, claims=claims, catalog=catalog, policies=POLICIES, wait_for_owner_seconds=0.3
    )


async def test_slow_owner_taken_over_and_reconciled_once(
    pool: AsyncConnectionPool[Any],
    redis: Redis,
    settings: Settings,
    provider_url: str,
    started_catalog: None,
) -> None:
    await provider_faults(provider_url, latency_ms=1500)
    cmd = command("propose_refund", REFUND, roles=("refund",), approved=True)
    slow = executor(pool, redis, settings, "slow-owner")
    other = executor(pool, redis, settings, "second-owner")
    reconciler = Reconciler(pool=pool, catalog=catalog, attempts=5, backoff_base=0.1)

    first = asyncio.create_task(slow.execute(cmd, trace_id=None))
    await asyncio.sleep(0.3)  # the slow owner's effect is pending downstream
    duplicate = await other.execute(cmd.model_copy(update={"call_id": "c-dup"}), trace_id=None)
    assert duplicate.unknown  # the second owner took over: the entry is unknown now
    settled = []
    for _ in range(50):
        # Other tests' unknown operations in this database may be settled too; ours counts.
        settled += [o for o in await reconciler.run_due() if o.operation_id == cmd.operation_id]
        if settled:
            break
        await asyncio.sleep(0.1)
    late = await first

    # Owed to both calls: the slow owner's and the duplicate answered `unknown`.
    assert sorted((o.call_id, o.status) for o in settled) == sorted(
        [(cmd.call_id, Status.SUCCEEDED), ("c-dup", Status.SUCCEEDED)]
    )
    assert late.outcome.status in (Status.SUCCEEDED, Status.UNKNOWN)
    if late.outcome.status is Status.SUCCEEDED:
        assert late.outcome.result == settled[0].result
    assert (await provider_stats(provider_url))["by_key"][cmd.operation_id] == 1
    assert (
        await scalar(
            pool, "SELECT status FROM command_ledger WHERE operation_id = %s", cmd.operation_id
        )
        == "succeeded"
    )
    assert (
        await scalar(
            pool,
            "SELECT count(*) FROM audit_log WHERE call_id = %s AND kind = 'late_result'",
            cmd.call_id,
        )
        == 1
    )
    assert (
        await scalar(pool, "SELECT status FROM refunds WHERE operation_id = %s", cmd.operation_id)
        == "succeeded"
    )
