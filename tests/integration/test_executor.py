from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from approvals.signing import approval_keys, receipt_for
from commands.policy import PolicySet
from commands.reference import catalog
from config.settings import Settings
from executors.claims import ClaimStore
from executors.executor import CommandExecutor
from executors.reconciler_store import Reconciler
from schemas.envelopes import ActorRef, CommittedCommand, Outcome, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint

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
    call_id = f"c-{uuid.uuid4().hex[:12]}"
    return CommittedCommand(
        operation_id=f"{tenant}:{key}",
        call_id=call_id,
        tenant=tenant,
        actor=ActorRef(sub="agent-1", roles=roles),
        tool=tool,
        arguments=arguments,
        fingerprint=fp,
        effect=found.effect,
        policy_version=POLICIES.version,
        approval=receipt_for(
            call_id=call_id,
            tenant=tenant,
            fingerprint=fp,
            policy_version=POLICIES.version,
            approver="boss",
            decided_at=now,
            expires_at=now + timedelta(minutes=5),
            keys=approval_keys(Settings()),
        )
        if approved
        else None,
        committed_at=now,
    )


@pytest.fixture
async def executor(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, provider_url: str
) -> AsyncIterator[CommandExecutor]:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    claims = ClaimStore(redis, prefix=settings.topic_prefix, owner="test-executor")
    yield CommandExecutor(
        pool=pool, claims=claims, catalog=catalog, policies=POLICIES, retry_attempts=2
    )
    await catalog.stop()


async def run(executor: CommandExecutor, cmd: CommittedCommand) -> Outcome:
    return (await executor.execute(cmd, trace_id=None)).outcome


async def scalar(pool: AsyncConnectionPool[Any], sql: str, *params: Any) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    return next(iter(row.values())) if row else None


async def provider_stats(provider_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{provider_url}/_stats") as r:
        stats: dict[str, Any] = await r.json()
        return stats


async def provider_faults(provider_url: str, **faults: Any) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{provider_url}/_faults", json=faults) as r,
    ):
        assert r.status == 200


async def test_read_takes_no_claim_and_writes_no_ledger_row(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], redis: Redis
) -> None:
    """Reads have no effect to deduplicate (docs/execution.md, "Reads"): asked again with the
    same key, a read runs again and answers with current data; each call is audited."""
    first = command("get_payment", {"payment_id": "pay_A1001"})
    outcome = await run(executor, first)
    assert outcome.status is Status.SUCCEEDED
    assert outcome.result is not None and outcome.result["currency"] == "EUR"
    again = first.model_copy(update={"call_id": f"{first.call_id}-retry"})
    assert (await run(executor, again)).result == outcome.result
    other = command("get_payment", {"payment_id": "pay_A1002"}, key=first.idempotency_key)
    assert (await run(executor, other)).status is Status.SUCCEEDED  # no conflict for reads
    assert (
        await scalar(
            pool, "SELECT count(*) FROM command_ledger WHERE operation_id = %s", first.operation_id
        )
        == 0
    )
    assert await redis.keys(f"*{first.idempotency_key}*") == []
    for call_id in (first.call_id, again.call_id, other.call_id):
        assert (
            await scalar(
                pool,
                "SELECT count(*) FROM audit_log WHERE call_id = %s AND kind = 'read'",
                call_id,
            )
            == 1
        )


async def test_write_replays_and_same_key_other_arguments_is_conflict(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any]
) -> None:
    arguments = {
        "payment_id": "pay_A1001",
        "account_holder": "Ada",
        "account_number": "DE44500105175407324931",
    }
    first = command("add_payout_account", arguments, approved=True, roles=("refund",))
    outcome = await run(executor, first)
    assert outcome.status is Status.SUCCEEDED, outcome.error
    again = first.model_copy(update={"call_id": f"{first.call_id}-retry"})
    replayed = await run(executor, again)
    assert (replayed.call_id, replayed.result) == (again.call_id, outcome.result)
    other = command(
        "add_payout_account",
        {**arguments, "account_holder": "Eve"},
        key=first.idempotency_key,
        approved=True,
        roles=("refund",),
    )
    conflict = await run(executor, other)
    assert conflict.status is Status.CONFLICT
    assert conflict.error is not None and conflict.error.code is ErrorCode.CONFLICT
    assert (
        await scalar(
            pool, "SELECT count(*) FROM command_ledger WHERE operation_id = %s", first.operation_id
        )
        == 1
    )


async def test_foreign_payment_is_not_found_at_commit(executor: CommandExecutor) -> None:
    outcome = await run(executor, command("get_payment", {"payment_id": "pay_B2001"}))
    assert outcome.status is Status.FAILED
    assert outcome.error is not None and outcome.error.code is ErrorCode.NOT_FOUND


REFUND = {"payment_id": "pay_A1002", "amount_minor": 1, "reason": "integration test"}


async def refundable(pool: AsyncConnectionPool[Any]) -> int:
    return int(
        await scalar(
            pool,
            "SELECT refundable_minor FROM payments "
            "WHERE tenant = 'tenant-a' AND payment_id = 'pay_A1002'",
        )
    )


async def test_refund_needs_receipt_then_runs_once_downstream(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], redis: Redis, provider_url: str
) -> None:
    refused = await run(executor, command("propose_refund", REFUND, roles=("refund",)))
    assert refused.error is not None and refused.error.code is ErrorCode.PRECONDITION_FAILED
    approved = command("propose_refund", REFUND, roles=("refund",), approved=True)
    before = await refundable(pool)
    done = await run(executor, approved)
    assert done.status is Status.SUCCEEDED, done
    assert done.result is not None and done.result["provider_ref"].startswith("prv_")
    await redis.flushall()
    assert (await run(executor, approved)).result == done.result
    assert before - await refundable(pool) == 1
    assert (
        await scalar(
            pool, "SELECT status FROM refunds WHERE operation_id = %s", approved.operation_id
        )
        == "succeeded"
    )
    assert (await provider_stats(provider_url))["by_key"] == {approved.operation_id: 1}


async def test_transient_failures_are_retried_then_released(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], provider_url: str
) -> None:
    await provider_faults(provider_url, fail_before=1)
    ok = await run(executor, command("propose_refund", REFUND, roles=("refund",), approved=True))
    assert ok.status is Status.SUCCEEDED
    before = await refundable(pool)
    await provider_faults(provider_url, fail_before=5)
    spent = command("propose_refund", REFUND, roles=("refund",), approved=True)
    outcome = await run(executor, spent)
    assert outcome.error is not None and outcome.error.code is ErrorCode.RETRY_EXHAUSTED
    assert await refundable(pool) == before  # the reservation was released
    assert (
        await scalar(pool, "SELECT status FROM refunds WHERE operation_id = %s", spent.operation_id)
        == "failed"
    )
    assert spent.operation_id not in (await provider_stats(provider_url))["by_key"]


async def test_lost_response_is_unknown_never_retried(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], provider_url: str
) -> None:
    await provider_faults(provider_url, drop_after=1)
    lost = command("propose_refund", REFUND, roles=("refund",), approved=True)
    first = await executor.execute(lost, trace_id=None)
    assert first.unknown
    assert first.outcome.status is Status.UNKNOWN
    assert first.outcome.error is not None and first.outcome.error.code is ErrorCode.TIMEOUT
    again = await executor.execute(lost.model_copy(update={"call_id": "c-again"}), trace_id=None)
    assert again.unknown
    stats = await provider_stats(provider_url)
    assert stats["by_key"] == {lost.operation_id: 1}
    assert (
        await scalar(
            pool, "SELECT status FROM command_ledger WHERE operation_id = %s", lost.operation_id
        )
        == "unknown"
    )
    # Reconciliation settles it from the provider's record, once.
    reconciler = Reconciler(pool=pool, catalog=catalog, attempts=3, backoff_base=0.1)
    settled: list[Outcome] = []
    for _ in range(50):
        # This database outlives test sessions: earlier sessions' unknown operations may be
        # due too, and are settled (or sent again) alongside; ours is the one that counts.
        settled += [o for o in await reconciler.run_due() if o.operation_id == lost.operation_id]
        if settled:
            break
    # Owed to both calls answered `unknown`: the first and the retry under the same key.
    assert [(o.call_id, o.status) for o in settled] == [
        (lost.call_id, Status.SUCCEEDED),
        ("c-again", Status.SUCCEEDED),
    ]
    assert (await provider_stats(provider_url))["by_key"][lost.operation_id] == 1


async def test_toctou_refundable_reduced_after_approval(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any], provider_url: str
) -> None:
    remaining = await refundable(pool)
    big = command(
        "propose_refund", {**REFUND, "amount_minor": remaining}, roles=("refund",), approved=True
    )
    async with pool.connection() as conn:  # another channel refunds part of it meanwhile
        await conn.execute(
            "UPDATE payments SET refundable_minor = refundable_minor - 1 "
            "WHERE tenant = 'tenant-a' AND payment_id = 'pay_A1002'"
        )
    try:
        outcome = await run(executor, big)
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.PRECONDITION_FAILED
        assert big.operation_id not in (await provider_stats(provider_url))["by_key"]
    finally:
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE payments SET refundable_minor = refundable_minor + 1 "
                "WHERE tenant = 'tenant-a' AND payment_id = 'pay_A1002'"
            )


async def run_approved_refund(
    pool: AsyncConnectionPool[Any],
    redis: Redis,
    settings: Settings,
    provider_url: str,
    **executor: Any,
) -> tuple[CommittedCommand, Outcome]:
    """One approved refund through an executor built with ``executor``'s extra arguments
    (a function of the command: ``cancelled``, ``freezes``)."""
    refund = command("propose_refund", REFUND, roles=("refund",), approved=True)
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    try:
        built = CommandExecutor(
            pool=pool,
            claims=ClaimStore(redis, prefix=settings.topic_prefix, owner="t"),
            catalog=catalog,
            policies=POLICIES,
            **{name: of(refund) for name, of in executor.items()},
        )
        return refund, await run(built, refund)
    finally:
        await catalog.stop()


async def test_cancelled_before_the_effect(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, provider_url: str
) -> None:
    _, outcome = await run_approved_refund(
        pool, redis, settings, provider_url, cancelled=lambda refund: {refund.call_id}
    )
    assert (outcome.status, outcome.error and outcome.error.code) == (
        Status.CANCELLED,
        ErrorCode.CANCELLED,
    )
    assert (await provider_stats(provider_url))["posts"] == 0


class FrozenAfterCommit:
    """A freeze source whose first answer (the commit-time check) is "nothing frozen" and
    every later one (the last check before the effect) freezes the refund's payer."""

    def __init__(self, scope: str) -> None:
        from commands.freezes import NO_FREEZES, applied
        from schemas.envelopes import FreezeRecord

        self.asked = 0
        self._before = NO_FREEZES
        record = FreezeRecord(
            scope=scope, frozen=True, by="ops-1", reason="incident 7", at=datetime.now(UTC)
        )
        self._after = applied(NO_FREEZES, record)

    @property
    def current(self) -> Any:
        self.asked += 1
        return self._before if self.asked == 1 else self._after


async def test_a_subject_frozen_between_commit_and_effect_stops_the_effect(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, provider_url: str
) -> None:
    """The last check before the effect decides on the resource the commit-time check
    loaded: a freeze of its owner (`subject:`) stops the refund there too."""
    freezes = FrozenAfterCommit("subject:tenant-a:bob@example.com")  # pay_A1002's payer
    _, outcome = await run_approved_refund(
        pool, redis, settings, provider_url, freezes=lambda _refund: freezes
    )
    assert freezes.asked == 2  # at commit, then before the effect
    assert outcome.error is not None and outcome.error.code is ErrorCode.FROZEN
    assert (await provider_stats(provider_url))["posts"] == 0
