from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from commands.policy import PolicySet
from commands.reference import catalog
from executors.dedup import OutcomeCache
from executors.executor import CommandExecutor
from schemas.envelopes import ActorRef, ApprovalReceipt, CommittedCommand, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from schemas.settings import Settings

pytestmark = pytest.mark.integration

POLICIES = PolicySet.from_directory()


def command(
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str | None = None,
    tenant: str = "tenant-a",
    roles: tuple[str, ...] = ("support",),
    approved: bool = False,
) -> CommittedCommand:
    key = key or f"k-{uuid.uuid4().hex[:12]}"
    fp = fingerprint(tenant=tenant, tool=tool, arguments=arguments, policy_version=POLICIES.version)
    now = datetime.now(UTC)
    found = catalog.get(tool)
    assert found is not None
    return CommittedCommand(
        operation_id=f"{tenant}:{key}",
        call_id=f"c-{uuid.uuid4().hex[:12]}",
        tenant=tenant,
        actor=ActorRef(sub="agent-1", roles=roles),
        tool=tool,
        arguments=arguments,
        fingerprint=fp,
        effect=found.effect,
        policy_version=POLICIES.version,
        approval=ApprovalReceipt(
            approver="boss", decided_at=now, expires_at=now + timedelta(minutes=5), fingerprint=fp
        )
        if approved
        else None,
        committed_at=now,
    )


@pytest.fixture
def executor(pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings) -> CommandExecutor:
    cache = OutcomeCache(redis, prefix=settings.topic_prefix, ttl_seconds=60)
    return CommandExecutor(pool=pool, cache=cache, catalog=catalog, policies=POLICIES)


async def ledger_rows(pool: AsyncConnectionPool[Any], tenant: str, key: str) -> list[Any]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status FROM command_ledger WHERE tenant = %s AND idempotency_key = %s",
            (tenant, key),
        )
        rows: list[Any] = await cur.fetchall()
        return rows


async def test_read_runs_once_and_replays_from_cache_and_ledger(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], redis: Redis
) -> None:
    first = command("get_payment", {"payment_id": "pay_A1001"})
    outcome = await executor.execute(first, trace_id=None)
    assert outcome.status is Status.SUCCEEDED
    assert outcome.result is not None and outcome.result["currency"] == "EUR"
    again = first.model_copy(update={"call_id": "c-retry"})
    cached = await executor.execute(again, trace_id=None)
    assert (cached.call_id, cached.result) == ("c-retry", outcome.result)
    await redis.flushall()  # losing Redis must not run anything twice
    from_ledger = await executor.execute(again, trace_id=None)
    assert from_ledger.result == outcome.result
    assert await ledger_rows(pool, "tenant-a", first.idempotency_key) == [{"status": "succeeded"}]


async def test_same_key_other_arguments_is_conflict(executor: CommandExecutor) -> None:
    first = command("get_payment", {"payment_id": "pay_A1001"})
    assert (await executor.execute(first, trace_id=None)).status is Status.SUCCEEDED
    other = command("get_payment", {"payment_id": "pay_A1002"}, key=first.idempotency_key)
    outcome = await executor.execute(other, trace_id=None)
    assert outcome.status is Status.CONFLICT
    assert outcome.error is not None and outcome.error.code is ErrorCode.CONFLICT


async def test_foreign_payment_is_not_found_at_commit(executor: CommandExecutor) -> None:
    outcome = await executor.execute(
        command("get_payment", {"payment_id": "pay_B2001"}), trace_id=None
    )
    assert outcome.status is Status.FAILED
    assert outcome.error is not None and outcome.error.code is ErrorCode.NOT_FOUND


async def test_refund_without_receipt_is_refused_and_with_receipt_runs_once(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], redis: Redis
) -> None:
    args = {"payment_id": "pay_A1002", "amount_minor": 1, "reason": "integration test"}
    refused = await executor.execute(
        command("propose_refund", args, roles=("refund",)), trace_id=None
    )
    assert refused.error is not None and refused.error.code is ErrorCode.PRECONDITION_FAILED
    approved = command("propose_refund", args, roles=("refund",), approved=True)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT refundable_minor FROM payments WHERE tenant='tenant-a' AND payment_id=%s",
            ("pay_A1002",),
        )
        before = (await cur.fetchone())["refundable_minor"]
    done = await executor.execute(approved, trace_id=None)
    assert done.status is Status.SUCCEEDED, done
    await redis.flushall()
    await executor.execute(approved, trace_id=None)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT refundable_minor FROM payments WHERE tenant='tenant-a' AND payment_id=%s",
            ("pay_A1002",),
        )
        after = (await cur.fetchone())["refundable_minor"]
        cur = await conn.execute(
            "SELECT count(*) AS n FROM refunds WHERE operation_id = %s", (approved.operation_id,)
        )
        refunds = (await cur.fetchone())["n"]
    assert (before - after, refunds) == (1, 1)
