"""Turns between the batches one process handles at once (issue 27, fair admission).

A partition's batch of many records (a backlog: one tenant's flood on its lanes) is *bulk*.
At each of its yield points (:func:`turn`, where it used to ``sleep(0)``) it gives way to the
batches of few records in flight on any partition of the process (other lanes' interactive
calls), until they are done or ``GIVE_WAY_SECONDS`` passed. Without this, a one-record batch
of another tenant waited, at each of its steps (limiter, validation, publication, the next
stage's), for a slice of the flood's batch: the event loop is FIFO, so every step of the
small batch queued behind another chunk of the big one.

The wait is bounded, so small batches arriving without pause slow a backlog but never stop
it; and bulk batches never wait for one another (a throughput run is all bulk).

What tells them apart is volume, not who sends it: the process cannot know who floods, only
which partition or lane brings many records. A batch is bulk when it holds at least
``BULK_RECORDS`` records, or when its partition or lane (:class:`RecentVolume`) brought at
least that many within the last ``VOLUME_WINDOW_SECONDS``: an admitted flood arrives at its
limit's rate in batches of a few records each, and those batches held another tenant's call
as long as a backlog did (issue 27: B's command waited 20-30 ms in the executor behind A's
200 admitted reads a second, each batch of them small)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from weakref import WeakSet

# A batch of at least this many records is bulk (it gives way to the smaller ones).
BULK_RECORDS = 64
# The longest a bulk batch waits at one yield point for the small batches in flight.
GIVE_WAY_SECONDS = 0.02
# A partition or lane that brought ``BULK_RECORDS`` records within this long is heavy: its
# batches are bulk however small.
VOLUME_WINDOW_SECONDS = 1.0

_bulk: ContextVar[bool] = ContextVar("ratifier_bulk_batch", default=False)
# The tasks handling a small batch now (tasks of a stopped loop are done, so never waited on).
_small: WeakSet[asyncio.Task[object]] = WeakSet()


class RecentVolume:
    """Records per key (a partition, a lane) lately, counted in two half windows: what a key
    brought within the last half ``window`` to whole ``window``, at O(1) a batch. What is
    older than a whole window is dropped when the half window turns."""

    def __init__(self, window: float = VOLUME_WINDOW_SECONDS) -> None:
        self._half = window / 2
        self._turned: float | None = None  # when the current half window began
        self._current: dict[Hashable, int] = {}
        self._previous: dict[Hashable, int] = {}

    def add(self, key: Hashable, records: int, *, now: float | None = None) -> int:
        """Count ``records`` for ``key``; its records in the window, these included."""
        now = time.monotonic() if now is None else now
        if self._turned is None:
            self._turned = now
        elif now - self._turned >= self._half:
            # Two half windows or more since the last turn: nothing recent is left.
            stale = now - self._turned >= 2 * self._half
            self._previous = {} if stale else self._current
            self._current = {}
            self._turned = now
        count = self._current.get(key, 0) + records
        self._current[key] = count
        return count + self._previous.get(key, 0)

    def heavy(self, key: Hashable, records: int) -> bool:
        """Count ``records`` for ``key``; whether its batches are bulk now."""
        return self.add(key, records) >= BULK_RECORDS


@contextmanager
def batch_of(records: int, *, heavy: bool = False) -> Iterator[None]:
    """Mark the current task, for the ``with`` block, as handling a batch of ``records``
    (the tasks it starts meanwhile inherit the mark); ``heavy``: bulk however few (its
    partition or lane brings many, :class:`RecentVolume`)."""
    if heavy or records >= BULK_RECORDS:
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
