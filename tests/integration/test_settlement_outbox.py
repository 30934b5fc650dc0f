"""The settlement outbox as the reconciler's loop uses it: outcomes taken stay locked (a
concurrent reconciler skips them) and unmarked until acknowledged; abandoned ones are taken
again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from commands.sql import named_query
from executors.reconciler_store import Outbox
from schemas.envelopes import Outcome, Stage, Status

pytestmark = pytest.mark.integration


async def owe(pool: AsyncConnectionPool[Any], operation_id: str, call_id: str) -> Outcome:
    outcome = Outcome(
        call_id=call_id,
        tool="propose_refund",
        tenant="tenant-a",
        status=Status.SUCCEEDED,
        stage=Stage.RECONCILE,
        operation_id=operation_id,
        at=datetime.now(UTC),
    )
    async with pool.connection() as conn:
        await conn.execute(
            named_query("executors", "owe_outcome"),
            {
                "tenant": "tenant-a",
                "operation_id": operation_id,
                "call_id": call_id,
                "outcome": Jsonb(outcome.model_dump(mode="json")),
            },
        )
    return outcome


async def published(pool: AsyncConnectionPool[Any], operation_id: str) -> list[bool]:
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(
            "SELECT published_at IS NOT NULL AS done FROM settlement_outbox "
            "WHERE operation_id = %s ORDER BY id",
            (operation_id,),
        )
        return [bool(r["done"]) for r in await cur.fetchall()]


async def test_taken_outcomes_are_locked_until_acknowledged(
    pool: AsyncConnectionPool[Any],
) -> None:
    operation_id = f"tenant-a:outbox-{uuid.uuid4().hex[:10]}"
    owed = [await owe(pool, operation_id, f"call-{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
    mine, other = Outbox(pool), Outbox(pool)

    assert await mine.take(operation_id=operation_id) == owed
    # Another reconciler meanwhile: nothing to take, nothing marked yet.
    assert await other.take(operation_id=operation_id) == []
    assert await published(pool, operation_id) == [False, False]

    await mine.abandon()  # e.g. a stop before the broker acknowledged them
    assert await published(pool, operation_id) == [False, False]
    assert await other.take(operation_id=operation_id) == owed
    await other.acknowledged()
    assert await published(pool, operation_id) == [True, True]
    assert await mine.take(operation_id=operation_id) == []
    await mine.acknowledged()  # nothing taken: nothing to do
