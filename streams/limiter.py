"""Fleet-wide limits: token buckets and concurrency slots in Redis, shared by every
validator worker, decided for a whole batch by one Lua script (``lua/admit.lua``) in one
round trip.

Consistency (docs/operations.md, "Admission and limits"): Redis executes a script
atomically, so workers never double-spend a token; Redis' own clock refills the buckets.
A worker that dies mid-batch has drawn tokens for calls its successor sees again: the
script remembers each call's answer (its decision mark, kept ``concurrency_lease_seconds``)
and gives a redelivered call the same answer without drawing again, so a call gets one final
outcome. A Redis that loses its data (restart without persistence, failover) starts every
bucket full: at most one burst per bucket is admitted beyond the limit. While Redis cannot be
reached, reads are admitted and writes refused (settings ``admission.fail_open_*``).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from commands.limits import Bucket, CallScope
from config.settings import Admission
from schemas.envelopes import Effect
from schemas.names import REDIS_LIMIT_PREFIX, REDIS_SLOTS_PREFIX

log = logging.getLogger("ratifier.admission")

_LUA = Path(__file__).parent / "lua"
ADMIT_SCRIPT = (_LUA / "admit.lua").read_text(encoding="utf-8")
RELEASE_SCRIPT = (_LUA / "release.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Admission's answer for one call: admitted, or refused with the advised wait."""

    admitted: bool
    retry_after: float | None = None
    # Why refused: "limit", "shed" (lag) or "unavailable" (Redis away, failing closed).
    reason: str | None = None


ADMITTED = Verdict(admitted=True)

# Before the call id in the decision mark of a call whose context does not verify: not a
# character of a call id (CALL_ID_PATTERN), so a forged call's answer is never the one a
# verified call of the same id gets (its mark is its own).
UNVERIFIED_MARK = "~"


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One call and the buckets it draws from."""

    call: CallScope
    buckets: tuple[Bucket, ...]


def script_arguments(
    asks: Sequence[Ask], *, prefix: str, settings: Admission, worker: str = "-"
) -> tuple[list[str], list[str | float | int]]:
    """The KEYS and ARGV of ``admit.lua`` for ``asks`` (pure): each distinct bucket once, the
    calls as runs of those drawing from the same buckets, and their ids in one string;
    ``worker`` names the asking worker (its fair share of a bucket, the script's header)."""
    index: dict[str, int] = {}
    keys: list[str] = []
    bucket_args: list[str | float | int] = []
    plan: list[str] = []
    run: tuple[int, ...] | None = None
    count = 0
    # The calls of a batch mostly share their buckets' tuple (Admission.buckets remembers
    # it per tenant, agent and tool): its indexes are found once per tuple.
    drawn_by: dict[int, tuple[int, ...]] = {}
    for ask in asks:
        same = drawn_by.get(id(ask.buckets))
        if same is None:
            drawn: list[int] = []
            for bucket in ask.buckets:
                for kind, limit, capacity in _counters(bucket):
                    key = f"{REDIS_LIMIT_PREFIX}{prefix}{bucket.key}:{kind}"
                    if key not in index:
                        index[key] = len(keys) + 1
                        keys.append(key)
                        bucket_args += [kind, limit, capacity]
                    drawn.append(index[key])
            same = drawn_by[id(ask.buckets)] = tuple(drawn)
        if same != run:
            if run is not None:
                plan.append(_run(count, run))
            run, count = same, 0
        count += 1
    if run is not None:
        plan.append(_run(count, run))
    argv: list[str | float | int] = [
        len(keys),
        settings.max_retry_after_seconds,
        settings.concurrency_lease_seconds,
        f"{REDIS_SLOTS_PREFIX}{prefix}",
        worker,
        settings.fair_share_window_seconds,
        *bucket_args,
        " ".join(plan),
        " ".join(
            ask.call.call_id if ask.call.verified else UNVERIFIED_MARK + ask.call.call_id
            for ask in asks
        ),
    ]
    return keys, argv


def _run(count: int, drawn: tuple[int, ...]) -> str:
    return " ".join(map(str, (count, len(drawn), *drawn)))


def _counters(bucket: Bucket) -> list[tuple[str, float, float]]:
    found: list[tuple[str, float, float]] = []
    if bucket.rate is not None:
        found.append(("r", bucket.rate, bucket.capacity))
    if bucket.concurrency is not None:
        found.append(("c", bucket.concurrency, bucket.concurrency))
    return found


class FleetLimiter:
    """The shared buckets of one deployment (its topic prefix keeps deployments apart)."""

    def __init__(self, redis: Redis, settings: Admission, *, prefix: str) -> None:
        self._redis = redis
        self._settings = settings
        self._prefix = prefix
        # This worker's name in the buckets' fair shares (unique per limiter: a process that
        # restarts is a new worker; the old name ages out of the window).
        self.worker = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._admit = redis.register_script(ADMIT_SCRIPT)
        self._release = redis.register_script(RELEASE_SCRIPT)
        self.unavailable = 0  # batches decided without Redis (a metric for operators)

    async def close(self) -> None:
        await self._redis.aclose()

    async def admit(self, asks: Sequence[Ask]) -> list[Verdict]:
        """One verdict per ask, in order; calls without buckets are admitted without Redis."""
        counted = [a for a in asks if a.buckets]
        if not counted:
            return [ADMITTED] * len(asks)
        keys, argv = script_arguments(
            counted, prefix=self._prefix, settings=self._settings, worker=self.worker
        )
        try:
            answers = await self._admit(keys=keys, args=argv)
        except (RedisError, OSError) as exc:
            self.unavailable += 1
            log.warning("admission: Redis unavailable (%s); failing per settings", exc)
            decided = iter([self._without_redis(a.call) for a in counted])
        else:
            refusals: dict[int, Verdict] = {}  # one verdict per advised wait
            verdicts = []
            for ms in answers:
                wait = int(ms)
                if wait == 0:
                    verdicts.append(ADMITTED)
                    continue
                found = refusals.get(wait)
                if found is None:
                    found = refusals[wait] = Verdict(
                        admitted=False, retry_after=wait / 1000, reason="limit"
                    )
                verdicts.append(found)
            if len(verdicts) != len(counted):
                raise RuntimeError(f"admit.lua answered {len(verdicts)} of {len(counted)} calls")
            decided = iter(verdicts)
        return [next(decided) if a.buckets else ADMITTED for a in asks]

    def _without_redis(self, call: CallScope) -> Verdict:
        is_read = call.effect is Effect.READ
        open_ = self._settings.fail_open_reads if is_read else self._settings.fail_open_writes
        if open_:
            return ADMITTED
        return Verdict(
            admitted=False,
            retry_after=self._settings.shed_retry_after_seconds,
            reason="unavailable",
        )

    async def release(self, call_ids: Sequence[str]) -> int:
        """Free the concurrency slots of calls that ended; how many were freed."""
        if not call_ids:
            return 0
        marks = [f"{REDIS_SLOTS_PREFIX}{self._prefix}{c}" for c in call_ids]
        return int(await self._release(keys=marks, args=list(call_ids)))

    async def usage(self, bucket_keys: Sequence[str]) -> dict[str, tuple[float | None, int]]:
        """Per bucket key: tokens left (as last written) and slots held (`ratifier limits`)."""
        found: dict[str, tuple[float | None, int]] = {}
        for key in bucket_keys:
            base = f"{REDIS_LIMIT_PREFIX}{self._prefix}{key}"
            tokens = await self._redis.hget(f"{base}:r", "t")
            held = await self._redis.zcard(f"{base}:c")
            found[key] = (float(tokens) if tokens is not None else None, int(held))
        return found
