"""Turns between one process's batches (runtime/turns.py): a bulk batch gives way at its
yield points to the small batches in flight, for a bounded time; small batches and bulk
batches among themselves never wait for one another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from runtime import turns
from runtime.turns import (
    BULK_RECORDS,
    GIVE_WAY_SECONDS,
    VOLUME_WINDOW_SECONDS,
    RecentVolume,
    batch_of,
    small_in_flight,
    turn,
)


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


def test_a_heavy_batch_of_few_records_gives_way_like_a_backlog() -> None:
    """A lane that brings many (an admitted flood, a few records a batch) is bulk."""

    async def scenario() -> tuple[float, int]:
        async with a_small_batch_in_flight():
            with batch_of(2, heavy=True):
                began = time.monotonic()
                await turn()
                waited = time.monotonic() - began
                # A heavy batch is not small: another bulk batch does not wait for it.
                with batch_of(BULK_RECORDS):
                    counted = small_in_flight()
        return waited, counted

    waited, counted = asyncio.run(scenario())
    assert waited >= GIVE_WAY_SECONDS * 0.5
    assert counted == 1  # only the one-record batch


def test_recent_volume_counts_a_key_over_the_window_then_forgets_it() -> None:
    volume = RecentVolume()
    start = 1000.0
    step = VOLUME_WINDOW_SECONDS / 10
    # 8 records a tenth of the window: BULK_RECORDS (64) reached within the window.
    counts = [volume.add("a", 8, now=start + i * step) for i in range(8)]
    assert counts[-1] >= BULK_RECORDS
    assert counts == sorted(counts)
    # Another key is counted apart.
    assert volume.add("b", 1, now=start + 8 * step) == 1
    # A key idle for a whole window has nothing left.
    assert volume.add("a", 1, now=start + 8 * step + 2 * VOLUME_WINDOW_SECONDS) == 1


def test_a_trickle_never_turns_heavy_and_a_flood_does() -> None:
    volume = RecentVolume()
    # Tenant B: one record every 250 ms (the flood test's), for ten windows.
    b = [volume.add("b", 1, now=i * 0.25) for i in range(int(10 * VOLUME_WINDOW_SECONDS / 0.25))]
    assert max(b) < BULK_RECORDS
    # Tenant A at 200 records a second in batches of 2: heavy within the first window.
    a = [volume.add("a", 2, now=0.01 * i) for i in range(100)]
    first_heavy = next(i for i, n in enumerate(a) if n >= BULK_RECORDS)
    assert 0.01 * first_heavy < VOLUME_WINDOW_SECONDS
