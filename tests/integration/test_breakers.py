"""Circuit breakers on real Redis (runtime.breakers): two executors' views share one breaker;
an executor refuses a refund `unavailable` before its effect while the provider's breaker is
open, leaving no ledger entry and no claim, so the same call runs once the breaker closed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from approvals.signing import approval_keys
from commands.catalog import Catalog, ExecutionContext, HandlerResult
from commands.reference import catalog
from config.settings import BreakerThresholds, Settings
from dashboard.server import create_app
from executors.claims import ClaimKind, ClaimStore
from executors.executor import CommandExecutor, GroupMember
from executors.reads import BatchedReads, Read
from runtime.breaker_machine import BreakerState
from runtime.breakers import FleetBreakers
from schemas.envelopes import BreakerTransition, Status
from schemas.errors import ErrorCode, TransientFailure
from tests.integration.test_batched_reads import read as a_read
from tests.integration.test_executor import (
    POLICIES,
    REFUND,
    command,
    provider_faults,
    provider_stats,
    run,
    scalar,
)

pytestmark = pytest.mark.integration

LIMITS = BreakerThresholds(
    window_seconds=10,
    min_calls=4,
    failure_rate=0.5,
    slow_call_ms=1000,
    cooldown_seconds=5,
    half_open_probes=2,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def fleet(
    redis: Redis, prefix: str, clock: Clock, published: list[BreakerTransition], by: str
) -> FleetBreakers:
    async def publish(transition: BreakerTransition) -> None:
        published.append(transition)

    return FleetBreakers(redis, prefix=prefix, defaults=LIMITS, by=by, publish=publish, clock=clock)


async def test_two_executors_share_one_breaker(redis: Redis) -> None:
    prefix, clock = f"t{uuid.uuid4().hex[:8]}.", Clock()
    published: list[BreakerTransition] = []
    one = fleet(redis, prefix, clock, published, "executor-1")
    two = fleet(redis, prefix, clock, published, "executor-2")
    for breakers in (one, two, one):
        ticket = await breakers.admit("payments:write")
        assert ticket.allowed and not ticket.probe
        await breakers.record(ticket, ok=False, seconds=0.01)
    assert (await two.admit("payments:write")).allowed  # three attempts: under min_calls
    fourth = await two.admit("payments:write")
    await two.record(fourth, ok=False, seconds=0.01)
    # The fourth failure, counted by the second executor, opens it for both.
    assert [(t.from_state, t.to_state, t.by) for t in published] == [
        ("closed", "open", "executor-2")
    ]
    assert published[0].calls == 4 and published[0].failures == 4
    refused = await one.admit("payments:write")
    assert not refused.allowed and refused.retry_after == 5.0
    # Reads of the same downstream are judged apart: still closed.
    assert (await one.admit("payments:read")).allowed
    clock.now += 5
    probes = [await one.admit("payments:write"), await two.admit("payments:write")]
    assert all(p.allowed and p.probe for p in probes)
    assert not (await one.admit("payments:write")).allowed  # two probes under way: no third
    for breakers, probe in zip((one, two), probes, strict=True):
        await breakers.record(probe, ok=True, seconds=0.02)
    assert [t.to_state for t in published] == ["open", "half_open", "closed"]
    after = await two.admit("payments:write")
    assert after.allowed and not after.probe
    statuses = {s.breaker: s for s in await one.statuses()}
    assert statuses["payments:write"].state is BreakerState.CLOSED
    assert statuses["payments:write"].calls == 0  # the window starts afresh once closed


async def test_a_failed_probe_reopens_for_every_executor(redis: Redis) -> None:
    prefix, clock = f"t{uuid.uuid4().hex[:8]}.", Clock()
    published: list[BreakerTransition] = []
    one = fleet(redis, prefix, clock, published, "executor-1")
    two = fleet(redis, prefix, clock, published, "executor-2")
    for _ in range(4):
        await one.record(await one.admit("payments:write"), ok=False, seconds=0.01)
    clock.now += 6
    probe = await two.admit("payments:write")
    assert probe.probe
    await two.record(probe, ok=False, seconds=0.01)
    assert [t.to_state for t in published] == ["open", "half_open", "open"]
    assert not (await one.admit("payments:write")).allowed


@pytest.fixture
async def guarded(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings, provider_url: str
) -> AsyncIterator[tuple[CommandExecutor, FleetBreakers, Clock]]:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    clock = Clock()
    breakers = fleet(redis, f"t{uuid.uuid4().hex[:8]}.", clock, [], "test-executor")
    claims = ClaimStore(redis, prefix=settings.topic_prefix, owner="test-executor")
    yield (
        CommandExecutor(
            pool=pool,
            claims=claims,
            catalog=catalog,
            policies=POLICIES,
            retry_attempts=2,
            breakers=breakers,
        ),
        breakers,
        clock,
    )
    await catalog.stop()


async def test_an_open_breaker_refuses_before_the_effect_and_leaves_no_trace(
    guarded: tuple[CommandExecutor, FleetBreakers, Clock],
    pool: AsyncConnectionPool[Any],
    redis: Redis,
    settings: Settings,
    provider_url: str,
) -> None:
    executor, breakers, clock = guarded
    await provider_faults(provider_url, fail_before=1000)  # an outage: 503, nothing applied
    for _ in range(2):  # two attempts each: four failures open it
        failed = await run(
            executor, command("propose_refund", REFUND, roles=("refund",), approved=True)
        )
        assert failed.error is not None and failed.error.code is ErrorCode.RETRY_EXHAUSTED
    posts = (await provider_stats(provider_url))["posts"]
    assert posts == 4
    refused_call = command("propose_refund", REFUND, roles=("refund",), approved=True)
    refused = await run(executor, refused_call)
    assert refused.status is Status.REJECTED
    assert refused.error is not None and refused.error.code is ErrorCode.UNAVAILABLE
    assert refused.error.retryable and refused.error.retry_after == 5.0
    assert (await provider_stats(provider_url))["posts"] == posts  # no attempt
    ledger = await scalar(
        pool,
        "SELECT count(*) FROM command_ledger WHERE operation_id = %s",
        refused_call.operation_id,
    )
    assert ledger == 0
    claim_key = f"ratifier:claim:{settings.topic_prefix}{refused_call.tenant}:"
    assert not [k async for k in redis.scan_iter(f"{claim_key}{refused_call.idempotency_key}*")]
    # The provider recovers; after the cool-down the same call (same key) runs, as a probe.
    await provider_faults(provider_url, fail_before=0)
    clock.now += 5
    done = await run(executor, refused_call)  # the same call again (its receipt names it)
    assert done.status is Status.SUCCEEDED, done.error
    assert (await provider_stats(provider_url))["posts"] == posts + 1
    statuses = {s.breaker: s for s in await breakers.statuses()}
    assert statuses["payments:write"].state is BreakerState.HALF_OPEN  # one of two probes


async def test_the_dashboard_shows_every_breaker(redis: Redis, settings: Settings) -> None:
    own = settings.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:8]}."})
    breakers = FleetBreakers(redis, prefix=own.topic_prefix, defaults=LIMITS, by="test")
    for _ in range(4):
        await breakers.record(await breakers.admit("payments:write"), ok=False, seconds=0.01)
    await breakers.record(await breakers.admit("payments:read"), ok=True, seconds=0.01)
    async with TestClient(TestServer(create_app(own))) as client:
        response = await client.get("/api/breakers")
        assert response.status == 200
        body = await response.json()
        page = await (await client.get("/")).text()
    shown = {b["breaker"]: b for b in body["breakers"]}
    assert shown["payments:write"]["state"] == "open" and shown["payments:write"]["since"]
    assert (shown["payments:write"]["calls"], shown["payments:write"]["failures"]) == (4, 4)
    assert shown["payments:read"]["state"] == "closed" and shown["payments:read"]["calls"] == 1
    assert 'id="breakers"' in page


async def test_a_read_tool_naming_a_downstream_has_its_own_read_breaker(
    pool: AsyncConnectionPool[Any], redis: Redis
) -> None:
    """Reads are judged by their downstream's read breaker, apart from its writes: failing
    reads open it, and later reads end `unavailable` without their handler running."""
    handled: list[str] = []

    async def failing(context: ExecutionContext) -> HandlerResult:
        handled.append(context.operation_id)
        raise TransientFailure()

    reference = catalog.get("get_payment")
    assert reference is not None
    flaky = Catalog([replace(reference, handler=failing, downstream="warehouse")])
    clock = Clock()
    breakers = fleet(redis, f"t{uuid.uuid4().hex[:8]}.", clock, [], "test-executor")
    reads = BatchedReads(
        pool=pool,
        catalog=flaky,
        policies=POLICIES,
        receipt_keys=approval_keys(Settings()),
        breakers=breakers,
    )
    first = await reads.execute(
        [Read(command=a_read("pay_A1001"), trace_id=None) for _ in range(4)]
    )
    codes = [e.outcome.error.code for e in first if e.outcome.error is not None]
    assert codes == [ErrorCode.RETRYABLE_ERROR] * 4 and len(handled) == 4
    later = await reads.execute(
        [Read(command=a_read("pay_A1001"), trace_id=None) for _ in range(3)]
    )
    for execution in later:
        error = execution.outcome.error
        assert error is not None and error.code is ErrorCode.UNAVAILABLE, execution.outcome
        assert error.retry_after == 5.0
    assert len(handled) == 4  # not attempted
    assert (await breakers.admit("warehouse:write")).allowed  # writes are judged apart


async def test_a_group_member_refused_by_an_open_breaker_leaves_no_trace(
    guarded: tuple[CommandExecutor, FleetBreakers, Clock],
    pool: AsyncConnectionPool[Any],
    provider_url: str,
) -> None:
    """In a group commit, the members refused by the open breaker roll back alone (their
    savepoint): no ledger entry, their claims given back and not finished; the others of the
    group are unaffected (here an internal write, with no downstream)."""
    executor, breakers, _ = guarded
    for _ in range(4):
        await breakers.record(await breakers.admit("payments:write"), ok=False, seconds=0.01)
    refunds = [command("propose_refund", REFUND, roles=("refund",), approved=True)]
    refunds.append(command("propose_refund", REFUND, roles=("refund",), approved=True))
    payout = command(
        "add_payout_account",
        {
            "payment_id": "pay_A1001",
            "account_holder": "Breaker Test",
            "account_number": "DE44500105175407324931",
        },
        approved=True,
        roles=("refund",),
    )
    group = [*refunds, payout]
    claims = await executor.claim_many(group)
    posts = (await provider_stats(provider_url))["posts"]
    done = await executor.execute_group(
        [GroupMember(command=c, trace_id=None, claim=k) for c, k in zip(group, claims, strict=True)]
    )
    assert all(d is not None for d in done)
    codes = [d.outcome.error.code if d and d.outcome.error else None for d in done]
    assert codes == [ErrorCode.UNAVAILABLE, ErrorCode.UNAVAILABLE, None]
    assert [d.released for d in done if d is not None] == [True, True, False]
    assert (await provider_stats(provider_url))["posts"] == posts
    rows = await scalar(
        pool,
        "SELECT count(*) FROM command_ledger WHERE tenant = 'tenant-a' AND operation_id = ANY(%s)",
        [c.operation_id for c in group],
    )
    assert rows == 1  # the payout only
    finishes = [
        executor.finish_of(c, k, d) for c, k, d in zip(group, claims, done, strict=True) if d
    ]
    assert [f is None for f in finishes] == [True, True, False]
    # Their claims were given back: claimed afresh (not busy, not done) by a retry.
    again = await executor.claim_many(refunds)
    assert {k.kind for k in again} == {ClaimKind.CLAIMED}
