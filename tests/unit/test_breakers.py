"""The circuit breaker's state machine (runtime.breaker_machine), pure: window thresholds,
cool-down, half-open probes, and reads and writes judged by separate breakers."""

from __future__ import annotations

from commands.catalog import downstream_of
from commands.reference import catalog
from config.settings import BreakerThresholds
from executors.breakers import catalog_thresholds
from executors.decisions import status_for
from executors.outcomes import unavailable_outcome
from runtime.breaker_machine import (
    BreakerState,
    BreakerView,
    Window,
    admit,
    after_attempt,
    tripped,
)
from runtime.breakers import breaker_name
from schemas.envelopes import ErrorInfo, Status
from schemas.errors import ErrorCode
from tests.unit.test_executor_decisions import command

LIMITS = BreakerThresholds(
    window_seconds=10,
    min_calls=10,
    failure_rate=0.5,
    slow_call_ms=1000,
    slow_call_rate=0.1,
    cooldown_seconds=5,
    half_open_probes=2,
)
CLOSED = BreakerView()


def test_too_few_calls_never_open_however_many_fail() -> None:
    assert tripped(Window(calls=9, failures=9), LIMITS) is None
    verdict = after_attempt(
        CLOSED, Window(calls=9, failures=9), ok=False, probe=False, now_ms=1, limits=LIMITS
    )
    assert verdict.next is None


def test_failure_rate_at_the_threshold_opens() -> None:
    assert tripped(Window(calls=10, failures=4), LIMITS) is None
    verdict = after_attempt(
        CLOSED, Window(calls=10, failures=5), ok=False, probe=False, now_ms=7, limits=LIMITS
    )
    assert verdict.next == BreakerView(state=BreakerState.OPEN, since_ms=7, generation=1)
    assert "5 of 10" in verdict.reason


def test_latency_opens_when_the_percentile_is_over_the_bound() -> None:
    # p90 > 1000 ms ⇔ more than 10 % of attempts slower than 1000 ms.
    assert tripped(Window(calls=20, slow=2), LIMITS) is None
    reason = tripped(Window(calls=20, slow=3), LIMITS)
    assert reason is not None and "1000 ms" in reason


def test_open_refuses_with_the_rest_of_the_cooldown_then_lets_a_probe_through() -> None:
    opened = BreakerView(state=BreakerState.OPEN, since_ms=10_000, generation=3)
    refused = admit(opened, 11_500, LIMITS)
    assert not refused.allowed and refused.next is None
    assert refused.retry_after == 3.5
    probe = admit(opened, 15_000, LIMITS)
    assert probe.allowed and probe.probe
    assert probe.next == BreakerView(
        state=BreakerState.HALF_OPEN, since_ms=15_000, generation=4, probes=1
    )


def test_closed_lets_everything_through_without_writing() -> None:
    answer = admit(CLOSED, 1, LIMITS)
    assert answer.allowed and not answer.probe and answer.next is None


def test_half_open_lets_only_its_probes_through() -> None:
    half = BreakerView(state=BreakerState.HALF_OPEN, since_ms=0, generation=4, probes=1)
    second = admit(half, 100, LIMITS)
    assert second.allowed and second.probe and second.next is not None
    assert second.next.probes == 2
    full = second.next
    refused = admit(full, 200, LIMITS)
    assert not refused.allowed and refused.retry_after is not None and refused.retry_after > 0


def test_lost_probes_are_given_up_after_a_cooldown() -> None:
    full = BreakerView(state=BreakerState.HALF_OPEN, since_ms=0, generation=4, probes=2)
    answer = admit(full, 5_000, LIMITS)
    assert answer.allowed and answer.probe
    assert answer.next is not None and answer.next.probes == 1 and answer.next.generation == 5


def test_probes_that_all_succeed_close_it() -> None:
    half = BreakerView(state=BreakerState.HALF_OPEN, since_ms=0, generation=4, probes=2)
    first = after_attempt(half, Window(), ok=True, probe=True, now_ms=10, limits=LIMITS)
    assert first.next is not None and first.next.state is BreakerState.HALF_OPEN
    assert first.next.successes == 1 and first.next.generation == 4
    second = after_attempt(first.next, Window(), ok=True, probe=True, now_ms=20, limits=LIMITS)
    assert second.next is not None and second.next.state is BreakerState.CLOSED
    assert second.next.generation == 5


def test_a_failed_probe_reopens_it() -> None:
    half = BreakerView(state=BreakerState.HALF_OPEN, since_ms=0, generation=4, probes=2)
    verdict = after_attempt(half, Window(), ok=False, probe=True, now_ms=30, limits=LIMITS)
    assert verdict.next == BreakerView(state=BreakerState.OPEN, since_ms=30, generation=5)


def test_results_of_calls_let_through_before_it_opened_move_nothing() -> None:
    opened = BreakerView(state=BreakerState.OPEN, since_ms=0, generation=1)
    window = Window(calls=100, failures=100)
    assert after_attempt(opened, window, ok=True, probe=False, now_ms=1, limits=LIMITS).next is None
    half = BreakerView(state=BreakerState.HALF_OPEN, since_ms=0, generation=2, probes=1)
    assert after_attempt(half, window, ok=False, probe=False, now_ms=1, limits=LIMITS).next is None


def test_reads_and_writes_of_a_downstream_have_separate_breakers() -> None:
    assert breaker_name("payments", read=True) == "payments:read"
    assert breaker_name("payments", read=False) == "payments:write"
    refund = catalog.get("propose_refund")
    payment = catalog.get("get_payment")
    assert refund is not None and payment is not None
    # The refund goes to the catalog's provider; a plain read of our own tables has none.
    assert downstream_of(catalog, refund) == "payments"
    assert downstream_of(catalog, payment) is None
    assert catalog_thresholds(catalog) == {}


def test_unavailable_is_a_retryable_rejection_with_retry_after() -> None:
    assert status_for(ErrorCode.UNAVAILABLE) is Status.REJECTED
    info = ErrorInfo.of(ErrorCode.UNAVAILABLE, retry_after=2.5)
    assert info.retryable and info.retry_after == 2.5
    outcome = unavailable_outcome(command(), 1.23456, None)
    assert outcome.error is not None and outcome.error.retry_after == 1.235
    assert outcome.status is Status.REJECTED
