"""The writes of a partition batch are group-committed (CommandExecutor.execute_group,
docs/execution.md "Group commit"): one transaction for the group's ledger work, one for its
settlements, each member in its own savepoint, on real PostgreSQL, Redis and the provider.

One commit for a group is seen from another connection at the executor's crash points: just
before the group's commit none of its ledger rows is visible, just after it all are."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from approvals.signing import approval_keys
from commands.catalog import Catalog, ExecutionContext, HandlerResult
from commands.payments.handlers import add_payout_account
from commands.reference import catalog
from config.settings import Settings
from executors.claims import Claim, ClaimKind, ClaimStore
from executors.crash_points import CrashPoint
from executors.executor import CommandExecutor, GroupMember
from executors.reads import BatchedReads
from executors.reconciler_store import Reconciler
from executors.service import ExecutorService
from feeds.policies import PolicyFeed
from schemas.envelopes import Actor, CommittedCommand, Outcome, Status
from schemas.errors import ErrorCode
from tests.integration.test_executor import (
    POLICIES,
    REFUND,
    command,
    provider_faults,
    provider_stats,
    scalar,
)
from tests.integration.test_pipelined_claims import committed_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def payout(holder: str, payment_id: str = "pay_A1001") -> CommittedCommand:
    return command(
        "add_payout_account",
        {
            "payment_id": payment_id,
            "account_holder": holder,
            "account_number": "DE44500105175407324931",
        },
        approved=True,
        roles=("refund",),
    )


def refund() -> CommittedCommand:
    return command("propose_refund", REFUND, roles=("refund",), approved=True)


def members(commands: list[CommittedCommand]) -> list[GroupMember]:
    return [
        GroupMember(command=c, trace_id=None, claim=Claim(kind=ClaimKind.UNAVAILABLE))
        for c in commands
    ]


class Observer:
    """Crash points that kill nothing: at each point passed, which of the watched
    operations another connection sees in the ledger, and with which status."""

    def __init__(self, settings: Settings, watched: list[CommittedCommand]) -> None:
        self._url = settings.storage.database_url
        self._watched = [c.operation_id for c in watched]
        self.seen: list[tuple[CrashPoint, dict[str, str]]] = []

    def reached(self, point: CrashPoint) -> None:
        with psycopg.connect(self._url) as conn:
            rows = conn.execute(
                "SELECT operation_id, status FROM command_ledger "
                "WHERE tenant = 'tenant-a' AND operation_id = ANY(%s)",
                (self._watched,),
            ).fetchall()
        self.seen.append((point, {op: status for op, status in rows}))

    def at(self, point: CrashPoint) -> list[dict[str, str]]:
        return [visible for p, visible in self.seen if p is point]


def ops(commands: list[CommittedCommand]) -> set[str]:
    return {c.operation_id for c in commands}


async def ledger_rows(pool: AsyncConnectionPool[Any], commands: list[CommittedCommand]) -> int:
    return int(
        await scalar(
            pool,
            "SELECT count(*) FROM command_ledger WHERE tenant = 'tenant-a' "
            "AND operation_id = ANY(%s)",
            [c.operation_id for c in commands],
        )
    )


@pytest.fixture
async def executor(
    pool: AsyncConnectionPool[Any], settings: Settings, provider_url: str
) -> AsyncIterator[CommandExecutor]:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    yield CommandExecutor(
        pool=pool, claims=None, catalog=catalog, policies=POLICIES, retry_attempts=2
    )
    await catalog.stop()


def fragile(breaks_for: str) -> Catalog:
    """add_payout_account whose handler has a bug for one account holder."""

    async def handler(ctx: ExecutionContext) -> HandlerResult:
        if ctx.arguments.model_dump().get("account_holder") == breaks_for:
            raise RuntimeError("a handler bug")
        return await add_payout_account(ctx)

    tool = catalog.get("add_payout_account")
    assert tool is not None
    return Catalog([replace(tool, handler=handler)])


async def test_a_group_is_one_commit_and_a_failing_member_is_left_alone(
    pool: AsyncConnectionPool[Any], settings: Settings
) -> None:
    good = [payout(f"Holder {n}") for n in range(5)]
    bad = payout("Mallory")
    group = [*good[:2], bad, *good[2:]]
    observer = Observer(settings, group)
    executor = CommandExecutor(
        pool=pool,
        claims=None,
        catalog=fragile("Mallory"),
        policies=POLICIES,
        crash_points=observer,
    )

    done = await executor.execute_group(members(group))

    assert done[2] is None  # run alone by the caller; nothing of it committed
    answered = [d for d in done if d is not None]
    assert [d.outcome.status for d in answered] == [Status.SUCCEEDED] * len(good)
    assert [d.outcome.call_id for d in answered] == [c.call_id for c in good]
    assert await ledger_rows(pool, good) == len(good)
    assert await ledger_rows(pool, [bad]) == 0
    # Nothing visible before the group's commit, every member after it: one commit.
    assert observer.at(CrashPoint.GROUP_PREPARED) == [{}]
    (committed,) = observer.at(CrashPoint.GROUP_COMMITTED)
    assert set(committed) == ops(good)
    # Each member has its own audit row, written in the group's transaction.
    rows = await scalar(
        pool,
        "SELECT count(*) FROM audit_log WHERE tenant = 'tenant-a' AND call_id = ANY(%s)",
        [c.call_id for c in good],
    )
    assert rows >= len(good)


async def test_an_operation_in_the_ledger_already_is_answered_alone(
    executor: CommandExecutor, pool: AsyncConnectionPool[Any]
) -> None:
    first = payout("Ada")
    alone = await executor.execute(first, trace_id=None)
    assert alone.outcome.status is Status.SUCCEEDED
    retry = first.model_copy(update={"call_id": f"{first.call_id}-retry"})
    others = [payout("Grace"), payout("Alan")]

    done = await executor.execute_group(members([retry, *others]))

    assert done[0] is None
    assert [d.outcome.status for d in done[1:] if d is not None] == [Status.SUCCEEDED] * 2
    replayed = await executor.execute(retry, trace_id=None)
    assert replayed.outcome.result == alone.outcome.result  # one run, answered again
    assert await ledger_rows(pool, [first]) == 1


async def test_external_effects_of_a_group_settle_in_one_commit(
    pool: AsyncConnectionPool[Any], settings: Settings, provider_url: str
) -> None:
    await catalog.start(settings.model_copy(update={"provider_url": provider_url}))
    refunds = [refund() for _ in range(4)]
    observer = Observer(settings, refunds)
    executor = CommandExecutor(
        pool=pool, claims=None, catalog=catalog, policies=POLICIES, crash_points=observer
    )
    # The provider applies the first effect it gets, then drops its answer: that one is
    # unknown (never sent again), the others succeed.
    await provider_faults(provider_url, drop_after=1)

    try:
        done = await executor.execute_group(members(refunds))
    finally:
        await catalog.stop()

    statuses = sorted(d.outcome.status.value for d in done if d is not None)
    assert statuses == ["succeeded"] * 3 + ["unknown"]
    unknown = [d for d in done if d is not None and d.unknown]
    assert len(unknown) == 1 and unknown[0].outcome.error is not None
    assert unknown[0].outcome.error.code is ErrorCode.TIMEOUT
    by_key = (await provider_stats(provider_url))["by_key"]
    assert {c.operation_id: by_key.get(c.operation_id) for c in refunds} == {
        c.operation_id: 1 for c in refunds
    }
    # Prepared in one commit; every effect sent while all were pending; settled in one.
    (prepared,) = observer.at(CrashPoint.GROUP_COMMITTED)
    assert prepared == {op: "effect_pending" for op in ops(refunds)}
    assert all(v == prepared for v in observer.at(CrashPoint.AFTER_EFFECT))
    assert len(observer.at(CrashPoint.AFTER_EFFECT)) == len(refunds)
    first_settled = observer.at(CrashPoint.AFTER_LEDGER)[0]
    assert "effect_pending" not in first_settled.values()
    statuses_in_ledger = await scalar(
        pool,
        "SELECT array_agg(status ORDER BY status) FROM command_ledger "
        "WHERE tenant = 'tenant-a' AND operation_id = ANY(%s)",
        [c.operation_id for c in refunds],
    )
    assert statuses_in_ledger == ["succeeded"] * 3 + ["unknown"]
    # The test database outlives this session: settle the unknown one here, so that no later
    # session's reconciler finds it due and sends it to a provider that never saw it.
    (lost,) = [c for c in refunds if c.call_id == unknown[0].outcome.call_id]
    resolved = await Reconciler(pool=pool, catalog=catalog, attempts=1, backoff_base=0.1).resolve(
        lost.tenant,
        lost.operation_id,
        applied=True,
        reference=None,
        by=Actor(sub="test", tenant=lost.tenant, roles=("operator",)),
    )
    assert resolved is not None and resolved.status is Status.SUCCEEDED


async def test_a_poll_batch_is_one_group_per_partition(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings
) -> None:
    claims = ClaimStore(redis, prefix=f"group-{uuid.uuid4().hex[:8]}.", owner="exec-a")
    service = ExecutorService(settings, catalog=catalog, policies=PolicyFeed(settings, POLICIES))
    reads = BatchedReads(
        pool=pool, catalog=catalog, policies=POLICIES, receipt_keys=approval_keys(settings)
    )
    # The groups run concurrently, and each member locks its payment: groups of one payment
    # each, so that neither waits for the other past the group's lock timeout (a member that
    # does is rolled back and run alone after its group).
    zero = [payout(f"Zero {n}", "pay_A1001") for n in range(3)]
    one = [payout(f"One {n}", "pay_A1002") for n in range(3)]
    lone = payout("Lone")  # the only write of its partition: run alone
    observer = Observer(settings, [*zero, *one])
    executor = CommandExecutor(
        pool=pool, claims=claims, catalog=catalog, policies=POLICIES, crash_points=observer
    )
    records = [
        *(committed_record(c, n, 0) for n, c in enumerate(zero)),
        *(committed_record(c, n, 1) for n, c in enumerate(one)),
        committed_record(lone, 0, 2),
    ]

    handled = await service._handle_batch(records, executor=executor, reads=reads, pool=pool)

    outcomes = [h.emits[0].value for h in handled]
    assert all(isinstance(o, Outcome) and o.status is Status.SUCCEEDED for o in outcomes)
    # Two groups, each committed at once: at every point, all of a group or none of it.
    assert len(observer.at(CrashPoint.GROUP_COMMITTED)) == 2
    for _, visible in observer.seen:
        for group in (ops(zero), ops(one)):
            assert len(group & set(visible)) in (0, len(group)), visible
    assert set(observer.at(CrashPoint.GROUP_COMMITTED)[-1]) == ops(zero) | ops(one)
    assert await ledger_rows(pool, [lone]) == 1
    # The claims were finished after the batch, group members' too.
    assert {c.kind for c in await executor.claim_many([*zero, *one, lone])} == {ClaimKind.DONE}
