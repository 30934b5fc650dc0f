"""Circuit breakers per downstream, shared by every executor through Redis (docs/execution.md,
"Circuit breakers"). The decisions are `runtime.breaker_machine`'s; this is their I/O edge.

Per breaker (``<downstream>:<read|write>``), under ``REDIS_BREAKER_PREFIX`` and the topic
prefix: a hash with its state, and a hash of per-second attempt counts (the sliding window),
updated and summed atomically by one Lua script per attempt. A change of state is written
only if the stored state is still the one it was decided on (its generation and probe
counts), so concurrent executors agree on one transition, and the one that made it publishes
it (`BreakerTransition` on `breakers`) and logs it.

Redis away: calls are let through (fail open; the ledger and the claims keep effects at most
once, a breaker only spares a failing downstream) and attempts go uncounted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from config.settings import BreakerThresholds
from runtime.breaker_machine import (
    STATE_LEVEL,
    Admission,
    BreakerState,
    BreakerView,
    Window,
    admit,
    after_attempt,
)
from schemas.envelopes import BreakerTransition
from schemas.names import REDIS_BREAKER_PREFIX
from telemetry.metrics import count_breaker_refusal, set_breaker_state

log = logging.getLogger("ratifier.breakers")

# KEYS[1] state hash, KEYS[2] window hash, KEYS[3] the set of breaker names.
# ARGV: now_s, window_s, failed (0/1), slow (0/1), name.
# Counts the attempt in its second, drops seconds that left the window, and answers the
# window's sums with the stored state.
_RECORD = """
local now = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[2], now .. ':c', 1)
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[2], now .. ':f', 1) end
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[2], now .. ':s', 1) end
for old = now - width - 5, now - width do
  redis.call('HDEL', KEYS[2], old .. ':c', old .. ':f', old .. ':s')
end
redis.call('EXPIRE', KEYS[2], width * 2 + 10)
redis.call('SADD', KEYS[3], ARGV[5])
local calls, failures, slow = 0, 0, 0
for second = now - width + 1, now do
  calls = calls + tonumber(redis.call('HGET', KEYS[2], second .. ':c') or '0')
  failures = failures + tonumber(redis.call('HGET', KEYS[2], second .. ':f') or '0')
  slow = slow + tonumber(redis.call('HGET', KEYS[2], second .. ':s') or '0')
end
local state = redis.call('HMGET', KEYS[1], 'state', 'since', 'gen', 'probes', 'ok')
return {calls, failures, slow, state[1] or '', state[2] or '0', state[3] or '0',
        state[4] or '0', state[5] or '0'}
"""

# KEYS[1] state hash, KEYS[2] window hash, KEYS[3] the set of breaker names.
# ARGV: expected gen, probes, ok; new state, since, gen, probes, ok; clear window (0/1); name.
# Writes the new state only if the stored one is still the expected one.
_MOVE = """
local seen = redis.call('HMGET', KEYS[1], 'gen', 'probes', 'ok')
if (seen[1] or '0') ~= ARGV[1] or (seen[2] or '0') ~= ARGV[2] or (seen[3] or '0') ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'since', ARGV[5], 'gen', ARGV[6],
           'probes', ARGV[7], 'ok', ARGV[8])
if ARGV[9] == '1' then redis.call('DEL', KEYS[2]) end
redis.call('SADD', KEYS[3], ARGV[10])
return 1
"""

Publish = Callable[[BreakerTransition], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class Ticket:
    """A breaker's answer to one call: may it attempt its effect, is it a probe, and when
    to retry if not."""

    breaker: str
    allowed: bool
    probe: bool = False
    retry_after: float | None = None


@dataclass(frozen=True, kw_only=True)
class BreakerStatus:
    """A breaker as the dashboard and `ratifier` show it."""

    breaker: str
    state: BreakerState
    since: datetime | None
    calls: int
    failures: int
    slow: int


def breaker_name(downstream: str, *, read: bool) -> str:
    """The breaker judging a downstream's reads or its writes (they are judged apart)."""
    return f"{downstream}:{'read' if read else 'write'}"


def _view(fields: list[Any]) -> BreakerView:
    state, since, generation, probes, successes = (
        f.decode() if isinstance(f, bytes) else str(f) for f in fields
    )
    return BreakerView(
        state=BreakerState(state) if state else BreakerState.CLOSED,
        since_ms=int(since or 0),
        generation=int(generation or 0),
        probes=int(probes or 0),
        successes=int(successes or 0),
    )


class FleetBreakers:
    """The breakers of every downstream, kept in Redis and shared by every executor."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        defaults: BreakerThresholds,
        own: Mapping[str, BreakerThresholds] | None = None,
        by: str = "executor",
        publish: Publish | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._base = f"{REDIS_BREAKER_PREFIX}{prefix}"
        self._defaults = defaults
        self._own = dict(own or {})
        self._by = by
        self._publish = publish
        self._clock = clock
        self._record = redis.register_script(_RECORD)
        self._move = redis.register_script(_MOVE)

    def limits(self, breaker: str) -> BreakerThresholds:
        """The thresholds of ``breaker``: its catalog's own, else the settings' defaults."""
        return self._own.get(breaker, self._defaults)

    def _keys(self, breaker: str) -> list[str]:
        return [f"{self._base}{breaker}", f"{self._base}{breaker}:window", f"{self._base}names"]

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def admit(self, breaker: str) -> Ticket:
        """May a call judged by ``breaker`` attempt its effect now?"""
        limits = self.limits(breaker)
        try:
            for _ in range(5):  # a lost race for a probe: decide again on the new state
                view = await self._load(breaker)
                answer = admit(view, self._now_ms(), limits)
                why = "cool-down over: probing" if answer.probe else ""
                if answer.next is None or await self._store(breaker, view, answer.next, why):
                    return self._ticket(breaker, view, answer)
        except RedisError as exc:
            log.warning("breaker %s: Redis unavailable (%s); call let through", breaker, exc)
            return Ticket(breaker=breaker, allowed=True)
        count_breaker_refusal(breaker)
        return Ticket(breaker=breaker, allowed=False, retry_after=0.5)

    def _ticket(self, breaker: str, view: BreakerView, answer: Admission) -> Ticket:
        set_breaker_state(breaker, STATE_LEVEL[(answer.next or view).state])
        if not answer.allowed:
            count_breaker_refusal(breaker)
        return Ticket(
            breaker=breaker,
            allowed=answer.allowed,
            probe=answer.probe,
            retry_after=answer.retry_after,
        )

    async def record(self, ticket: Ticket, *, ok: bool, seconds: float) -> None:
        """Count an attempt's result (a failure: known not applied, or its outcome unknown)
        and move the breaker if it must."""
        limits = self.limits(ticket.breaker)
        now_ms = self._now_ms()
        slow = ok and seconds * 1000 > limits.slow_call_ms
        try:
            answer = await self._record(
                keys=self._keys(ticket.breaker),
                args=[
                    now_ms // 1000,
                    limits.window_seconds,
                    int(not ok),
                    int(slow),
                    ticket.breaker,
                ],
            )
            calls, failures, slowed = (int(v) for v in answer[:3])
            view = _view(answer[3:])
            window = Window(calls=calls, failures=failures, slow=slowed)
            verdict = after_attempt(
                view, window, ok=ok, probe=ticket.probe, now_ms=now_ms, limits=limits
            )
            if verdict.next is not None:
                await self._store(ticket.breaker, view, verdict.next, verdict.reason, window)
        except RedisError as exc:
            log.warning("breaker %s: attempt not counted (%s)", ticket.breaker, exc)

    async def still_closed_enough(self, ticket: Ticket) -> bool:
        """Whether a call may retry its attempt: its breaker has not opened meanwhile."""
        try:
            view = await self._load(ticket.breaker)
        except RedisError:
            return True
        return view.state is not BreakerState.OPEN

    async def _load(self, breaker: str) -> BreakerView:
        fields = await self._redis.hmget(
            self._keys(breaker)[0], ["state", "since", "gen", "probes", "ok"]
        )
        return _view([f or b"" for f in fields])

    async def _store(
        self,
        breaker: str,
        seen: BreakerView,
        new: BreakerView,
        reason: str,
        window: Window | None = None,
    ) -> bool:
        moved = await self._move(
            keys=self._keys(breaker),
            args=[
                seen.generation,
                seen.probes,
                seen.successes,
                new.state.value,
                new.since_ms,
                new.generation,
                new.probes,
                new.successes,
                int(new.state is BreakerState.CLOSED and seen.state is not BreakerState.CLOSED),
                breaker,
            ],
        )
        if not moved:
            return False
        set_breaker_state(breaker, STATE_LEVEL[new.state])
        if new.state is not seen.state:
            await self._announce(breaker, seen, new, reason, window or Window())
        return True

    async def _announce(
        self, breaker: str, seen: BreakerView, new: BreakerView, reason: str, window: Window
    ) -> None:
        limits = self.limits(breaker)
        log.warning("breaker %s: %s → %s (%s)", breaker, seen.state, new.state, reason)
        if self._publish is None:
            return
        transition = BreakerTransition(
            breaker=breaker,
            from_state=seen.state.value,
            to_state=new.state.value,
            reason=reason[:512],
            calls=window.calls,
            failures=window.failures,
            slow=window.slow,
            retry_after=limits.cooldown_seconds if new.state is BreakerState.OPEN else None,
            by=self._by,
            at=datetime.fromtimestamp(new.since_ms / 1000, UTC),
        )
        try:
            await self._publish(transition)
        except Exception:
            # The state is shared already; only its audit record is lost (logged above).
            log.exception("breaker %s: transition not published", breaker)

    async def statuses(self) -> list[BreakerStatus]:
        """Every breaker that has counted an attempt, with its window now."""
        names = sorted(
            n.decode() if isinstance(n, bytes) else str(n)
            for n in await self._redis.smembers(f"{self._base}names")
        )
        now_s = self._now_ms() // 1000
        found: list[BreakerStatus] = []
        for name in names:
            window_key = self._keys(name)[1]
            view = await self._load(name)
            width = self.limits(name).window_seconds
            seconds = range(now_s - width + 1, now_s + 1)
            fields = [f"{s}:{kind}" for s in seconds for kind in ("c", "f", "s")]
            counts = [int(v or 0) for v in await self._redis.hmget(window_key, fields)]
            found.append(
                BreakerStatus(
                    breaker=name,
                    state=view.state,
                    since=datetime.fromtimestamp(view.since_ms / 1000, UTC)
                    if view.since_ms
                    else None,
                    calls=sum(counts[0::3]),
                    failures=sum(counts[1::3]),
                    slow=sum(counts[2::3]),
                )
            )
        return found
