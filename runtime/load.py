"""A worker's queueing delay, published for fair admission (streams/fair_share.py).

Each lane stage (validator, authorizer, executor) reports how long its oldest record fetched
and not yet started has waited (``ConsumerLoop.waiting_seconds``), every ``period`` seconds,
into one Redis hash per deployment: the validators read the largest fresh one and, while it
is above the target, shed the heaviest tenants' calls. A report is a field per worker with
Redis' own time (never the worker's clock: hosts may be skewed); a worker that stops
reporting is stale after a moment and ignored, and its field is pruned by the readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from schemas.names import REDIS_LOAD_PREFIX

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("ratifier.runtime")

REPORT_SCRIPT = (Path(__file__).parent / "lua" / "report_load.lua").read_text(encoding="utf-8")


def cancelled_meanwhile(exc: BaseException) -> None:
    """Raise ``CancelledError`` when this task was being cancelled while ``exc`` came: the
    Redis client turns a cancellation in the middle of a command into a connection error,
    and a loop that caught it would go on, holding up its service's stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


def load_key(topic_prefix: str) -> str:
    """The deployment's load hash (its topic prefix keeps deployments apart)."""
    return f"{REDIS_LOAD_PREFIX}{topic_prefix}"


def worker_field(stage: str) -> str:
    """A reporting worker's field: its stage and a name unique to this process's life."""
    return f"{stage}/{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def report_waiting(
    redis: Redis,
    *,
    topic_prefix: str,
    stage: str,
    waiting: Sequence[Callable[[], float]],
    period: float,
    stop: asyncio.Event | None = None,
) -> None:
    """Every ``period`` seconds, the largest of ``waiting`` (seconds) as this worker's delay,
    until cancelled or ``stop``; Redis away is logged once per outage and waited out (a
    report missed only leaves the last one to go stale)."""
    script = redis.register_script(REPORT_SCRIPT)
    key, field = load_key(topic_prefix), worker_field(stage)
    failing = False
    while stop is None or not stop.is_set():
        delay_ms = max((w() for w in waiting), default=0.0) * 1000
        try:
            await script(keys=[key], args=[field, f"{delay_ms:.1f}"])
        except (RedisError, OSError) as exc:
            cancelled_meanwhile(exc)
            if not failing:
                log.warning("%s: queueing delay not reported (%s)", stage, exc)
            failing = True
        else:
            failing = False
        if stop is None:
            await asyncio.sleep(period)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
