"""The writes of a poll batch take their Redis claims in one round trip and finish them in
one (executors/claims.py `claim_many` / `finish_many`, executors/service.py): each claim
answers exactly as the same claim taken alone, and only the fence holder finishes."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from approvals.signing import approval_keys
from commands.reference import catalog
from config.settings import Settings
from executors.claims import ClaimFinish, ClaimKind, ClaimRequest, ClaimStore
from executors.executor import CommandExecutor
from executors.reads import BatchedReads
from executors.service import ExecutorService
from feeds.policies import PolicyFeed
from schemas.envelopes import CommittedCommand, Outcome, Stage, Status
from schemas.names import REDIS_CLAIM_PREFIX
from tests.integration.test_executor import POLICIES, command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def claim_outcome(key: str, tool: str = "add_payout_account") -> Outcome:
    """A succeeded outcome to store under the claim of ``key``."""
    return Outcome(
        call_id=f"c-{key}",
        tool=tool,
        tenant="tenant-a",
        status=Status.SUCCEEDED,
        stage=Stage.EXECUTE,
        at=datetime.now(UTC),
    )


def _now() -> int:
    return int(time.time() * 1000)


async def test_claim_many_answers_like_each_claim_alone(redis: Redis) -> None:
    prefix = f"pipelined-{uuid.uuid4().hex[:8]}."
    ours = ClaimStore(redis, prefix=prefix, owner="exec-a", lease_ms=60_000)
    theirs = ClaimStore(redis, prefix=prefix, owner="exec-b", lease_ms=60_000)
    fp, other_fp = "a" * 64, "b" * 64
    done, held, fresh = "k-done", "k-held", "k-fresh"
    finished = await ours.claim("tenant-a", done, fp, _now())
    assert await ours.finish("tenant-a", done, finished.fence, claim_outcome(done))
    held_by_them = await theirs.claim("tenant-a", held, fp, _now())

    claims = await ours.claim_many(
        [
            ClaimRequest(tenant="tenant-a", idempotency_key=fresh, fingerprint=fp),
            ClaimRequest(tenant="tenant-a", idempotency_key=done, fingerprint=fp),
            ClaimRequest(tenant="tenant-a", idempotency_key=done, fingerprint=other_fp),
            ClaimRequest(tenant="tenant-a", idempotency_key=held, fingerprint=fp),
            # Same key in another tenant: a claim of its own.
            ClaimRequest(tenant="tenant-b", idempotency_key=held, fingerprint=fp),
        ],
        _now(),
    )

    kinds = [c.kind for c in claims]
    assert kinds == [
        ClaimKind.CLAIMED,
        ClaimKind.DONE,
        ClaimKind.CONFLICT,
        ClaimKind.BUSY,
        ClaimKind.CLAIMED,
    ]
    assert claims[1].outcome is not None and claims[1].outcome.call_id == f"c-{done}"
    assert claims[3].previous_owner == "exec-b" and claims[3].fence == held_by_them.fence
    # Fencing numbers come from the one counter, as for claims taken alone.
    assert claims[0].fence > held_by_them.fence and claims[4].fence > claims[0].fence
    assert await ours.claim_many([], _now()) == []


async def test_finish_many_finishes_only_with_the_fence(redis: Redis) -> None:
    prefix = f"pipelined-{uuid.uuid4().hex[:8]}."
    first = ClaimStore(redis, prefix=prefix, owner="exec-a", lease_ms=1)
    later = ClaimStore(redis, prefix=prefix, owner="exec-b", lease_ms=60_000)
    fp = "c" * 64
    a = await first.claim("tenant-a", "k-a", fp, _now())
    b = await first.claim("tenant-a", "k-b", fp, _now())
    # k-b's lease (1 ms) ran out and another executor took it over with a new fence.
    taken = await later.claim("tenant-a", "k-b", fp, _now() + 10)
    assert taken.kind is ClaimKind.EXPIRED

    done = await first.finish_many(
        [
            ClaimFinish(tenant="tenant-a", idempotency_key="k-a", fence=a.fence,
                        outcome=claim_outcome("k-a")),
            ClaimFinish(tenant="tenant-a", idempotency_key="k-b", fence=b.fence,
                        outcome=claim_outcome("k-b")),
        ]
    )  # fmt: skip

    assert done == [True, False]
    assert (await later.claim("tenant-a", "k-a", fp, _now())).kind is ClaimKind.DONE
    assert (await later.claim("tenant-a", "k-b", fp, _now())).kind is ClaimKind.EXPIRED


def committed_record(
    cmd: CommittedCommand, offset: int, partition: int = 0
) -> ConsumerRecord[bytes, bytes]:
    """``cmd`` as the executor consumes it from `commands.committed` (key: its operation)."""
    value = cmd.to_bytes()
    return ConsumerRecord(
        topic="t.commands.committed",
        partition=partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=cmd.operation_id.encode(),
        value=value,
        checksum=None,
        serialized_key_size=len(cmd.operation_id),
        serialized_value_size=len(value),
        headers=(),
    )


async def test_a_batch_of_writes_claims_and_finishes_together(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings
) -> None:
    prefix = f"pipelined-{uuid.uuid4().hex[:8]}."
    claims = ClaimStore(redis, prefix=prefix, owner="exec-a")
    executor = CommandExecutor(pool=pool, claims=claims, catalog=catalog, policies=POLICIES)
    service = ExecutorService(settings, catalog=catalog, policies=PolicyFeed(settings, POLICIES))
    reads = BatchedReads(
        pool=pool, catalog=catalog, policies=POLICIES, receipt_keys=approval_keys(settings)
    )
    writes = [
        command(
            "add_payout_account",
            {
                "payment_id": "pay_A1001",
                "account_holder": f"Holder {n}",
                "account_number": "DE44500105175407324931",
            },
            approved=True,
            roles=("refund",),
        )
        for n in range(5)
    ]
    # A retry of the first write in the same batch (same key and arguments, another call).
    retry = writes[0].model_copy(update={"call_id": f"{writes[0].call_id}-retry"})
    batch = [*writes, retry]

    handled = await service._handle_batch(
        [committed_record(c, i) for i, c in enumerate(batch)],
        executor=executor,
        reads=reads,
        pool=pool,
    )

    outcomes = [h.emits[0].value for h in handled]
    assert all(isinstance(o, Outcome) and o.status is Status.SUCCEEDED for o in outcomes), [
        (o.status, o.error) for o in outcomes if isinstance(o, Outcome)
    ]
    assert [o.call_id for o in outcomes if isinstance(o, Outcome)] == [c.call_id for c in batch]
    first, again = outcomes[0], outcomes[-1]
    assert isinstance(first, Outcome) and isinstance(again, Outcome)
    assert again.result == first.result  # answered from the ledger, never run twice
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM command_ledger WHERE tenant = 'tenant-a' "
            "AND operation_id = ANY(%s)",
            ([c.operation_id for c in writes],),
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == len(writes)
    # Every claim was finished after the batch: the fast path now answers each operation.
    for c in writes:
        key = f"{prefix}{REDIS_CLAIM_PREFIX}{c.tenant}:{c.idempotency_key}"
        assert await redis.hget(key, "state") == b"done", key
    later = await executor.claim_many(writes)
    assert {c.kind for c in later} == {ClaimKind.DONE}
