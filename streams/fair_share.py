"""Fair admission by default (issue 45): with no limit declared, when the pipeline queues, the
heaviest tenants' calls are shed first, so that no tenant holds another's calls behind its
backlog, and a tenant alone may use all the capacity.

The signal is queueing delay, as CoDel's: each lane stage (validator, authorizer, executor)
reports how long its oldest record fetched and not yet started has waited (runtime/load.py).
The validators read the largest fresh report each ``fair_tick_seconds``, with every tenant's
recent calls, judged and admitted (exponentially weighted rates over ``fair_usage_seconds``,
kept fleet-wide in Redis: streams/lua/usage.lua).

Shedding: once the delay has stayed above ``fair_target_seconds`` for
``fair_interval_seconds`` (a burst that drains sooner is left alone, as CoDel leaves it), the
fraction of a heavy tenant's calls admitted halves each tick; a delay of four times the target
sheds them all at once, without waiting out the interval (an overload, not a burst). Below the
target it grows back by 1 per second, and a queue while it is still growing back is shed at
once (additive increase, multiplicative decrease).

Heavy: calling above the fair share, the max-min share (water level) of the capacity among
the active tenants (those calling at least ``fair_active_rate``/s), and above 1.5 times its
equal part of the demand (tenants calling alike are not one another's flood). With fewer than
two active tenants none is heavy. A shed call ends ``rejected/rate_limited`` with
``retry_after`` (``shed_retry_after_seconds``) and spends no token of any declared limit.

Redis away: nothing is shed for fairness (the last view is dropped), as reads fail open.
Decisions are per worker from the fleet's view (at most a tick old); the state and the rule
are pure (:func:`next_share`, :func:`heavy_tenants`), the round trip is at the edge
(:func:`watch_fair_share`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from config.settings import Admission as AdmissionSettings
from runtime.load import cancelled_meanwhile, load_key
from schemas.names import REDIS_USAGE_PREFIX

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("ratifier.admission")

USAGE_SCRIPT = (Path(__file__).parent / "lua" / "usage.lua").read_text(encoding="utf-8")

# While the delay is above the target, the admitted fraction of a heavy tenant's calls is
# multiplied by DECREASE each tick, and set to none at once from OVERLOAD times the target;
# below it, it grows by INCREASE per second (back to all in 1 s).
DECREASE = 0.5
OVERLOAD = 4.0
INCREASE = 1.0
# The capacity taken for fair shares is at most this part of the demand (heavy_tenants).
CAPACITY_OF_DEMAND = 0.5
# A heavy tenant calls at least this many times its equal part of the demand (heavy_tenants).
HEAVIER_THAN_EQUAL = 1.5
# A report of a stage's delay older than this many ticks is not counted (its worker stopped).
FRESH_TICKS = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class FairShare:
    """What fair admission does now: the fraction of each heavy tenant's calls it admits."""

    heavy: frozenset[str] = frozenset()
    admitting: float = 1.0
    delay: float = 0.0  # the largest fresh queueing delay of a lane stage (seconds)
    # Since when (monotonic seconds) the delay has been above the target without a break.
    above_since: float | None = None

    @property
    def shedding(self) -> bool:
        return bool(self.heavy) and self.admitting < 1.0


OPEN = FairShare()


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """A tenant's recent calls per second, fleet-wide: judged by admission, and admitted."""

    judged: float
    admitted: float


def water_level(rates: Sequence[float], capacity: float) -> float:
    """Pure: the max-min fair share of ``capacity`` among demands of ``rates``: each rate
    below the level is served in full and the rest shares what remains equally (infinite when
    every rate fits)."""
    remaining = capacity
    ordered = sorted(rates)
    for n, rate in enumerate(ordered):
        share = remaining / (len(ordered) - n)
        if rate > share:
            return share
        remaining -= rate
    return float("inf")


def heavy_tenants(usage: Mapping[str, Usage], *, active: float) -> frozenset[str]:
    """Pure: the active tenants (judged at least ``active`` calls/s) calling above their fair
    share (:func:`water_level`) of the capacity; none with fewer than two active tenants (a
    tenant alone may use it all). The capacity is taken as what the fleet admitted, at most
    :data:`CAPACITY_OF_DEMAND` of the calls judged: asked while the stages queue, so the
    capacity is below the demand, and at the onset nothing has been shed yet (everything
    judged was admitted)."""
    rates = {t: u for t, u in usage.items() if u.judged >= active}
    if len(rates) < 2:
        return frozenset()
    demand = [u.judged for u in rates.values()]
    admitted = sum(u.admitted for u in rates.values())
    level = water_level(demand, min(admitted, CAPACITY_OF_DEMAND * sum(demand)))
    # Heavier than the others too: tenants calling alike are not one another's flood (their
    # queue is everyone's, for the lag-based shedding), whatever the capacity turns out to be.
    above = HEAVIER_THAN_EQUAL * sum(demand) / len(demand)
    return frozenset(t for t, u in rates.items() if u.judged > level and u.judged > above)


def next_share(
    before: FairShare,
    *,
    delay: float,
    usage: Mapping[str, Usage],
    now: float,
    settings: AdmissionSettings,
) -> FairShare:
    """Pure: the next tick's fair share from the fleet's largest queueing delay (seconds) and
    every active tenant's rate at ``now`` (monotonic seconds; module docstring). As CoDel's,
    a queue must stay above the target for ``fair_interval_seconds`` before anything is
    shed: a burst that drains within it is left alone, unless it is an overload (the delay
    :data:`OVERLOAD` times the target), which is shed at once."""
    target = settings.fair_target_seconds
    above_since: float | None = None
    if delay > target:
        above_since = before.above_since if before.above_since is not None else now
    # Still growing back from shedding: a queue again is the same overload, shed at once (as
    # CoDel resumes dropping when it re-enters soon after it stopped).
    recovering = before.admitting < 1.0
    # An overload (OVERLOAD times the target) is no burst to wait out: at a flood's onset the
    # delay had passed 100 ms by the time the interval let it be shed (the flood test's log).
    overloaded = delay >= OVERLOAD * target
    if above_since is not None and (
        recovering or overloaded or now - above_since >= settings.fair_interval_seconds
    ):
        admitting = 0.0 if delay >= OVERLOAD * target else before.admitting * DECREASE
    elif above_since is not None:
        admitting = before.admitting
    else:
        admitting = min(1.0, before.admitting + INCREASE * settings.fair_tick_seconds)
    return FairShare(
        heavy=heavy_tenants(usage, active=settings.fair_active_rate),
        admitting=admitting,
        delay=delay,
        above_since=above_since,
    )


class FairShedder:
    """One validator worker's side of fair admission: counts the calls it judges per tenant
    (reported each tick) and sheds a heavy tenant's calls beyond the admitted fraction, in
    turn (every other call at a half), not at random."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.share = OPEN
        self.refusals = 0
        self._judged: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._credit: dict[str, float] = {}

    def admits(self, tenant: str) -> bool:
        """Whether a verified call of ``tenant`` is admitted (counted either way)."""
        self._judged[tenant] += 1
        share = self.share
        if share.admitting >= 1.0 or tenant not in share.heavy:
            return True
        credit = self._credit.get(tenant, 0.0) + share.admitting
        if credit >= 1.0:
            self._credit[tenant] = credit - 1.0
            return True
        self._credit[tenant] = credit
        self._refused[tenant] += 1
        self.refusals += 1
        return False

    def refused_after(self, tenant: str) -> None:
        """A call :meth:`admits` let through was refused later (a declared limit)."""
        self._refused[tenant] += 1

    def counted(self) -> dict[str, tuple[int, int]]:
        """Per tenant, the calls judged and admitted since the last call of this (and forget
        them)."""
        counted = {t: (n, n - self._refused.get(t, 0)) for t, n in self._judged.items()}
        self._judged, self._refused = Counter(), Counter()
        return counted

    def update(self, share: FairShare) -> None:
        before, self.share = self.share, share
        if before.shedding != share.shedding:
            log.warning(
                "admission: fair shares %s (queueing delay %.0f ms, heavy tenants %s)",
                "shedding" if share.shedding else "open",
                share.delay * 1000,
                ", ".join(sorted(share.heavy)) or "none",
            )
        self._credit = {t: c for t, c in self._credit.items() if t in share.heavy}


def parse_view(answer: Sequence[bytes | str]) -> tuple[float, dict[str, Usage]]:
    """Pure: ``usage.lua``'s answer as (the largest fresh delay in seconds, usage per tenant)."""

    def text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    delay = float(text(answer[0])) / 1000 if answer else 0.0
    usage = {
        text(answer[i]): Usage(
            judged=float(text(answer[i + 1])), admitted=float(text(answer[i + 2]))
        )
        for i in range(1, len(answer) - 2, 3)
    }
    return delay, usage


async def watch_fair_share(
    redis: Redis, shedder: FairShedder, *, topic_prefix: str, stop: asyncio.Event
) -> None:
    """Each tick until ``stop``: report this worker's judged calls, read the fleet's view, and
    give ``shedder`` its next share (off when ``fair_target_seconds`` is 0)."""
    settings = shedder.settings
    if settings.fair_target_seconds == 0:
        return
    script = redis.register_script(USAGE_SCRIPT)
    keys = [f"{REDIS_USAGE_PREFIX}{topic_prefix}", load_key(topic_prefix)]
    tick = settings.fair_tick_seconds
    failing = False
    while not stop.is_set():
        args: list[str | int | float] = [
            settings.fair_usage_seconds * 1000,
            FRESH_TICKS * tick * 1000,
            settings.fair_active_rate,
        ]
        for tenant, (judged, admitted) in shedder.counted().items():
            args += [tenant, judged, admitted]
        try:
            answer = await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            cancelled_meanwhile(exc)
            if not failing:
                log.warning("admission: fair shares off while Redis is away (%s)", exc)
            failing = True
            shedder.update(OPEN)
        else:
            failing = False
            delay, usage = parse_view(answer)
            shedder.update(
                next_share(
                    shedder.share,
                    delay=delay,
                    usage=usage,
                    now=asyncio.get_running_loop().time(),
                    settings=settings,
                )
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), tick)
