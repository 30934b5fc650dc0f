"""The one backoff ladder for transient infrastructure errors (storage or broker away).

A record that meets a transient error waits and is tried again; it is never skipped. A stop
requested while waiting ends the wait with :class:`Stopped` (nothing was done, so nothing is
committed, and the record is redelivered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("ratifier.runtime")

BACKOFF_SECONDS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 5.0)


class Stopped(Exception):
    """A stop was requested while waiting out a transient error."""


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based), capped at the last step."""
    return BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS) - 1)]


async def pause(seconds: float, stop: asyncio.Event | None) -> None:
    """Sleep ``seconds``; raise :class:`Stopped` at once if ``stop`` is set meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return
    raise Stopped


async def retrying(
    step: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    stop: asyncio.Event | None = None,
    first_retry: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """Run ``step`` until it does not raise one of ``retry_on``, backing off between tries.

    ``first_retry``, when given, runs once after the first failure and the step is retried at
    once (e.g. a pool check that drops every connection that died while idle, instead of one
    dead connection per backoff step)."""
    attempt = 0
    while True:
        try:
            return await step()
        except retry_on as exc:
            if attempt == 0 and first_retry is not None:
                await first_retry()
                attempt += 1
                continue
            delay = backoff(attempt)
            attempt += 1
            log.warning("%s unavailable (%s); retry %d in %.1fs", what, exc, attempt, delay)
            await pause(delay, stop)
