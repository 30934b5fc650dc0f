"""The circuit breaker of one downstream, as a pure state machine (docs/execution.md,
"Circuit breakers"); `runtime.breakers` keeps its state in Redis, shared by every executor.

closed → open: over the window, with at least ``min_calls`` attempts, the share of failures
reaches ``failure_rate`` or the share slower than ``slow_call_ms`` passes ``slow_call_rate``
(the p(1 - rate) latency is above ``slow_call_ms``: p90 for 0.1).
open → half-open: once ``cooldown_seconds`` have passed, the next call is its first probe.
half-open: up to ``half_open_probes`` calls are let through; all succeed → closed, one fails →
open again. Probes lost on the way (an executor that died, a call refused before its effect)
are given up after another cool-down, and new ones let through.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from config.settings import BreakerThresholds


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# The gauge's value per state (telemetry: 0 closed, 1 half-open, 2 open).
STATE_LEVEL: dict[BreakerState, int] = {
    BreakerState.CLOSED: 0,
    BreakerState.HALF_OPEN: 1,
    BreakerState.OPEN: 2,
}


@dataclass(frozen=True, kw_only=True)
class BreakerView:
    """A breaker's state as stored: ``since_ms`` when it entered it, ``generation`` bumped at
    every change of state (writes compare it), ``probes`` let through and ``successes`` seen
    while half-open."""

    state: BreakerState = BreakerState.CLOSED
    since_ms: int = 0
    generation: int = 0
    probes: int = 0
    successes: int = 0

    def moved(self, state: BreakerState, now_ms: int, *, probes: int = 0) -> BreakerView:
        return BreakerView(
            state=state, since_ms=now_ms, generation=self.generation + 1, probes=probes
        )


@dataclass(frozen=True, kw_only=True)
class Window:
    """The attempts of the last ``window_seconds``: how many, how many failed, how many were
    slower than ``slow_call_ms``."""

    calls: int = 0
    failures: int = 0
    slow: int = 0


@dataclass(frozen=True, kw_only=True)
class Admission:
    """Whether a call may attempt its effect now; ``next``: the state to store for it (a
    probe taken, a cool-down over), written only if the stored one is still ``view``."""

    allowed: bool
    probe: bool = False
    retry_after: float | None = None
    next: BreakerView | None = None


def admit(view: BreakerView, now_ms: int, limits: BreakerThresholds) -> Admission:
    """May a call attempt its effect now (see the module's docstring)?"""
    cooldown_ms = int(limits.cooldown_seconds * 1000)
    if view.state is BreakerState.CLOSED:
        return Admission(allowed=True)
    if view.state is BreakerState.OPEN:
        remaining_ms = view.since_ms + cooldown_ms - now_ms
        if remaining_ms > 0:
            return Admission(allowed=False, retry_after=remaining_ms / 1000)
        return Admission(
            allowed=True, probe=True, next=view.moved(BreakerState.HALF_OPEN, now_ms, probes=1)
        )
    if view.probes < limits.half_open_probes:
        return Admission(allowed=True, probe=True, next=replace(view, probes=view.probes + 1))
    if now_ms - view.since_ms >= cooldown_ms:
        # The probes never answered: give them up, let new ones through.
        return Admission(
            allowed=True, probe=True, next=view.moved(BreakerState.HALF_OPEN, now_ms, probes=1)
        )
    # Probes under way: their answers decide; ask again about when one is due.
    retry_after = max(0.1, (view.since_ms + cooldown_ms - now_ms) / 1000)
    return Admission(allowed=False, retry_after=min(retry_after, limits.cooldown_seconds))


def tripped(window: Window, limits: BreakerThresholds) -> str | None:
    """Why ``window`` opens a closed breaker, or None."""
    if window.calls < limits.min_calls:
        return None
    if window.failures / window.calls >= limits.failure_rate:
        return f"{window.failures} of {window.calls} attempts failed in {limits.window_seconds} s"
    if window.slow / window.calls > limits.slow_call_rate:
        return (
            f"{window.slow} of {window.calls} attempts took over {limits.slow_call_ms} ms "
            f"in {limits.window_seconds} s"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What an attempt's result does to the breaker: ``next`` to store (None: nothing),
    and why, when it changes state."""

    next: BreakerView | None = None
    reason: str = ""


def after_attempt(
    view: BreakerView,
    window: Window,
    *,
    ok: bool,
    probe: bool,
    now_ms: int,
    limits: BreakerThresholds,
) -> Verdict:
    """The breaker after an attempt ended (``window`` already counts it). Only probes move a
    half-open breaker; results of calls let through before it opened move nothing."""
    if view.state is BreakerState.CLOSED:
        reason = tripped(window, limits)
        if reason is None:
            return Verdict()
        return Verdict(next=view.moved(BreakerState.OPEN, now_ms), reason=reason)
    if view.state is not BreakerState.HALF_OPEN or not probe:
        return Verdict()
    if not ok:
        return Verdict(next=view.moved(BreakerState.OPEN, now_ms), reason="a probe failed")
    if view.successes + 1 >= limits.half_open_probes:
        reason = f"{limits.half_open_probes} probes succeeded"
        return Verdict(next=view.moved(BreakerState.CLOSED, now_ms), reason=reason)
    return Verdict(next=replace(view, successes=view.successes + 1))
