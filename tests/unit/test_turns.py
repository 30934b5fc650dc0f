"""Turns between one process's batches (runtime/turns.py): a bulk batch gives way at its
yield points to the small batches in flight, for a bounded time; small batches and bulk
batches among themselves never wait for one another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from runtime import turns
from runtime.turns import BULK_RECORDS, GIVE_WAY_SECONDS, batch_of, small_in_flight, turn


def test_a_bulk_batch_gives_way_to_a_small_batch_in_flight() -> None:
    order: list[str] = []

    async def small(started: asyncio.Event) -> None:
        with batch_of(1):
            started.set()
            await asyncio.sleep(0)  # its steps: each one a turn of the loop
            await asyncio.sleep(0)
            order.append("small done")

    async def bulk(started: asyncio.Event) -> None:
        with batch_of(BULK_RECORDS):
            await started.wait()
            await turn()
            order.append("bulk resumed")

    async def scenario() -> None:
        started = asyncio.Event()
        await asyncio.gather(bulk(started), small(started))

    asyncio.run(scenario())
    assert order == ["small done", "bulk resumed"]


def test_without_the_turns_the_bulk_batch_would_have_run_first() -> None:
    """The same scenario, the bulk batch yielding with ``sleep(0)``: it resumes before the
    small batch's second step (what the test above rules out)."""
    order: list[str] = []

    async def small(started: asyncio.Event) -> None:
        started.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        order.append("small done")

    async def bulk(started: asyncio.Event) -> None:
        await started.wait()
        await asyncio.sleep(0)
        order.append("bulk resumed")

    async def scenario() -> None:
        started = asyncio.Event()
        await asyncio.gather(bulk(started), small(started))

    asyncio.run(scenario())
    assert order == ["bulk resumed", "small done"]


@asynccontextmanager
async def a_small_batch_in_flight() -> AsyncIterator[None]:
    """A one-record batch that stays in flight for the ``with`` block."""
    release, started = asyncio.Event(), asyncio.Event()

    async def slow_small() -> None:
        with batch_of(1):
            started.set()
            await release.wait()

    task = asyncio.create_task(slow_small())
    await started.wait()
    try:
        yield
    finally:
        release.set()
        await task


def test_a_bulk_batch_waits_at_most_the_bound_for_a_small_one() -> None:
    async def scenario() -> float:
        async with a_small_batch_in_flight():
            assert small_in_flight() == 1
            with batch_of(BULK_RECORDS * 10):
                began = time.monotonic()
                await turn()
                waited = time.monotonic() - began
        assert small_in_flight() == 0
        return waited

    waited = asyncio.run(scenario())
    assert GIVE_WAY_SECONDS * 0.5 <= waited < GIVE_WAY_SECONDS * 10


def test_small_batches_and_unmarked_tasks_never_wait() -> None:
    async def scenario() -> None:
        async with a_small_batch_in_flight():
            with batch_of(BULK_RECORDS - 1):
                await asyncio.wait_for(turn(), GIVE_WAY_SECONDS / 4)  # small: no waiting
            await asyncio.wait_for(turn(), GIVE_WAY_SECONDS / 4)  # not in a batch

    asyncio.run(scenario())
    assert not list(turns._small)  # the finished batch is forgotten
