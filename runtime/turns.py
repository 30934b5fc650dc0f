"""Turns between the batches one process handles at once (issue 27, fair admission).

A partition's batch of many records (a backlog: one tenant's flood on its lanes) is *bulk*.
At each of its yield points (:func:`turn`, where it used to ``sleep(0)``) it gives way to the
batches of few records in flight on any partition of the process (other lanes' interactive
calls), until they are done or ``GIVE_WAY_SECONDS`` passed. Without this, a one-record batch
of another tenant waited, at each of its steps (limiter, validation, publication, the next
stage's), for a slice of the flood's batch: the event loop is FIFO, so every step of the
small batch queued behind another chunk of the big one.

The wait is bounded, so small batches arriving without pause slow a backlog but never stop
it; and bulk batches never wait for one another (a throughput run is all bulk). A batch's
size is what tells them apart, not its tenant: the process cannot know who floods, only
which partition has a backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from weakref import WeakSet

# A batch of at least this many records is bulk (it gives way to the smaller ones).
BULK_RECORDS = 64
# The longest a bulk batch waits at one yield point for the small batches in flight.
GIVE_WAY_SECONDS = 0.02

_bulk: ContextVar[bool] = ContextVar("ratifier_bulk_batch", default=False)
# The tasks handling a small batch now (tasks of a stopped loop are done, so never waited on).
_small: WeakSet[asyncio.Task[object]] = WeakSet()


@contextmanager
def batch_of(records: int) -> Iterator[None]:
    """Mark the current task, for the ``with`` block, as handling a batch of ``records``
    (the tasks it starts meanwhile inherit the mark)."""
    if records >= BULK_RECORDS:
        token = _bulk.set(True)
        try:
            yield
        finally:
            _bulk.reset(token)
        return
    task = asyncio.current_task()
    if task is not None:
        _small.add(task)
    try:
        yield
    finally:
        if task is not None:
            _small.discard(task)


def small_in_flight() -> int:
    """How many small batches are being handled now (a figure for tests and logs)."""
    return sum(1 for task in _small if not task.done())


async def turn() -> None:
    """A yield point: other tasks run meanwhile; in a bulk batch, the small batches in
    flight first run to their end (for at most ``GIVE_WAY_SECONDS``)."""
    if _bulk.get():
        waiting = [task for task in _small if not task.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=GIVE_WAY_SECONDS)
            return
    await asyncio.sleep(0)
