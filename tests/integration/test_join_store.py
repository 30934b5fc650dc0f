"""The approval-join's storage on real PostgreSQL (streams/join_store.py): a batch's state,
audit, outbox and applied offsets are written in one transaction or not at all; a call is
locked for one transaction at a time; outbox rows a worker holds are skipped by the others
and come back when it gives them up (or dies); the timer finds due states by their time,
per deployment."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from approvals.signing import approval_keys
from config.settings import Settings
from schemas.envelopes import Outcome, Stage, Status
from schemas.names import Topic
from schemas.vocabulary import AuditKind
from streams.approval import ApprovalState, AuditEntry, Phase, Rules, on_authorized
from streams.emit import Emit
from streams.join_store import Audit, Changes, JoinStore, JoinTransaction, Publish
from testsupport.records import authorized_refund

pytestmark = pytest.mark.integration

ARGS = {"payment_id": "pay_A1001", "amount_minor": 10, "reason": "late"}


@pytest.fixture
def store(pool: AsyncConnectionPool[Any]) -> JoinStore:
    return JoinStore(pool, deployment=f"t{uuid.uuid4().hex[:10]}.")


def pending(settings: Settings, call_id: str, *, ttl: timedelta) -> ApprovalState:
    now = datetime.now(UTC)
    call = authorized_refund(call_id, ARGS, now=now)
    rules = Rules(keys=approval_keys(settings), ttl=ttl)
    step = on_authorized(None, call, tool=None, now=now, rules=rules)
    assert step.state is not None and step.state.phase is Phase.PENDING
    return step.state


def outcome(call_id: str) -> Emit:
    return Emit(
        topic=Topic.OUTCOMES,
        key=call_id,
        value=Outcome.for_call(
            call_id=call_id,
            tool="propose_refund",
            tenant="tenant-a",
            status=Status.AWAITING_APPROVAL,
            stage=Stage.APPROVE,
            code=None,
            at=datetime.now(UTC),
        ),
    )


def changes(state: ApprovalState, *, offset: int) -> Changes:
    call_id = state.call_id
    return Changes(
        states={call_id: state},
        audits=[
            Audit(
                entry=AuditEntry(
                    kind=AuditKind.APPROVAL_REQUESTED,
                    tenant="tenant-a",
                    call_id=call_id,
                    detail={"n": 1},
                ),
                event_key=f"test:{call_id}:{offset}#0",
            )
        ],
        publish=[Publish(emit=outcome(call_id), call_id=call_id, traceparent=b"00-tp")],
        positions={(Topic.AUTHORIZED.value, 3): offset + 1},
    )


async def audit_rows(pool: AsyncConnectionPool[Any], call_id: str) -> int:
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.execute("SELECT count(*) AS n FROM audit_log WHERE call_id = %s", (call_id,))
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def outbox_rows(pool: AsyncConnectionPool[Any], deployment: str) -> int:
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(
            "SELECT count(*) AS n FROM approval_outbox WHERE deployment = %s", (deployment,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_batch_is_written_whole_and_its_offsets_move_with_it(
    store: JoinStore, pool: AsyncConnectionPool[Any], settings: Settings
) -> None:
    call_id = f"js-{uuid.uuid4().hex[:10]}"
    state = pending(settings, call_id, ttl=timedelta(minutes=5))
    async with store.transaction() as tx:
        assert await tx.lock_positions([(Topic.AUTHORIZED.value, 3)]) == {
            (Topic.AUTHORIZED.value, 3): 0
        }
        assert await tx.lock_calls([call_id]) == {call_id: None}
        ids = await tx.write(changes(state, offset=41))
    assert len(ids) == 1
    async with store.transaction() as tx:
        assert await tx.lock_positions([(Topic.AUTHORIZED.value, 3)]) == {
            (Topic.AUTHORIZED.value, 3): 42
        }
        assert await tx.lock_calls([call_id]) == {call_id: state}
    assert await audit_rows(pool, call_id) == 1
    assert await outbox_rows(pool, store.deployment) == 1


async def test_a_transaction_that_fails_leaves_nothing(
    store: JoinStore, pool: AsyncConnectionPool[Any], settings: Settings
) -> None:
    call_id = f"js-{uuid.uuid4().hex[:10]}"
    state = pending(settings, call_id, ttl=timedelta(minutes=5))

    async def dies() -> None:
        async with store.transaction() as tx:
            await tx.lock_positions([(Topic.AUTHORIZED.value, 3)])
            await tx.lock_calls([call_id])
            await tx.write(changes(state, offset=7))
            raise RuntimeError("the worker died before its commit")

    with pytest.raises(RuntimeError, match="died"):
        await dies()
    async with store.transaction() as tx:
        assert await tx.lock_positions([(Topic.AUTHORIZED.value, 3)]) == {
            (Topic.AUTHORIZED.value, 3): 0
        }
        assert await tx.lock_calls([call_id]) == {call_id: None}
    assert await audit_rows(pool, call_id) == 0
    assert await outbox_rows(pool, store.deployment) == 0


@pytest.mark.parametrize("pipelined", [False, True], ids=["timer", "batch"])
async def test_one_transaction_at_a_time_per_call(
    store: JoinStore, settings: Settings, pipelined: bool
) -> None:
    """The timer's ``lock_calls`` and a batch's pipelined ``lock`` alike."""
    call_id = f"js-{uuid.uuid4().hex[:10]}"
    state = pending(settings, call_id, ttl=timedelta(minutes=5))
    first_locked = asyncio.Event()
    release = asyncio.Event()

    async def locked(tx: JoinTransaction, partition: int) -> dict[str, ApprovalState | None]:
        if pipelined:
            # Records of the call on two topics' partitions (no partition lock in common).
            _applied, found = await tx.lock([(Topic.AUTHORIZED.value, partition)], [call_id])
            return found
        return await tx.lock_calls([call_id])

    async def first() -> None:
        async with store.transaction() as tx:
            assert await locked(tx, 0) == {call_id: None}
            first_locked.set()
            await release.wait()
            await tx.write(Changes(states={call_id: state}))

    async def second() -> ApprovalState | None:
        await first_locked.wait()
        async with store.transaction() as tx:
            found = await locked(tx, 1)
        return found[call_id]

    task = asyncio.create_task(first())
    seen = asyncio.create_task(second())
    await first_locked.wait()
    await asyncio.sleep(0)  # the second transaction waits on the lock, not on this test
    done, _ = await asyncio.wait({seen}, timeout=0.5)
    assert not done, "the second transaction read the call while the first held it"
    release.set()
    await task
    assert await asyncio.wait_for(seen, timeout=10) == state


async def test_taken_records_are_skipped_by_others_and_come_back_when_given_up(
    store: JoinStore, pool: AsyncConnectionPool[Any], settings: Settings
) -> None:
    calls = [f"js-{uuid.uuid4().hex[:10]}" for _ in range(3)]
    async with store.transaction() as tx:
        ids = await tx.write(
            Changes(
                states={},
                publish=[Publish(emit=outcome(c), call_id=c, traceparent=None) for c in calls],
            )
        )
    mine = await store.take(ids[:2])
    assert mine.ids == tuple(ids[:2])
    # A second taker of the same rows gets none of them.
    again = await store.take(ids)
    assert again.ids == (ids[2],)
    await again.clear()
    # Orphans are old rows nobody holds: none while they are new or held.
    _none, found = await store.orphans(age_seconds=60, limit=10)
    assert found == []
    taken, found = await store.orphans(age_seconds=0, limit=10)
    assert found == []  # held by ``mine``
    await taken.abandon()
    await mine.abandon()  # given back (as a worker's death would)
    taken, found = await store.orphans(age_seconds=0, limit=10)
    assert [o.call_id for o in found] == calls[:2]
    assert [o.emit for o in found] == [outcome_like(o.emit) for o in found]
    await taken.clear()
    assert await outbox_rows(pool, store.deployment) == 0


def outcome_like(emit: Emit) -> Emit:
    """The record read back equals what was written (same topic, key and fields)."""
    assert emit.topic is Topic.OUTCOMES and isinstance(emit.value, Outcome)
    return Emit(topic=emit.topic, key=emit.value.call_id, value=emit.value)


async def test_due_states_by_their_time_per_deployment(
    store: JoinStore, pool: AsyncConnectionPool[Any], settings: Settings
) -> None:
    soon = pending(settings, f"js-{uuid.uuid4().hex[:10]}", ttl=timedelta(seconds=1))
    sooner = pending(settings, f"js-{uuid.uuid4().hex[:10]}", ttl=timedelta(milliseconds=500))
    later = pending(settings, f"js-{uuid.uuid4().hex[:10]}", ttl=timedelta(hours=1))
    other = JoinStore(pool, deployment=f"t{uuid.uuid4().hex[:10]}.")
    for where in (store, other):
        async with where.transaction() as tx:
            await tx.write(Changes(states={s.call_id: s for s in (soon, sooner, later)}))
    now = datetime.now(UTC) + timedelta(seconds=2)
    assert await store.due(now, limit=10) == [sooner.call_id, soon.call_id]
    assert await store.due(now, limit=1) == [sooner.call_id]
    assert await store.due(datetime.now(UTC) - timedelta(seconds=5), limit=10) == []
    # Forgotten states are gone.
    async with store.transaction() as tx:
        await tx.write(Changes(states={sooner.call_id: None}))
    assert await store.due(now, limit=10) == [soon.call_id]
    assert await other.due(now, limit=10) == [sooner.call_id, soon.call_id]
