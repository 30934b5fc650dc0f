"""The reconciler's pure parts: who is owed a settlement, its readdressing and publication,
the check backoff that bounds how long an unknown call waits, and what `ratifier ops unknown`
says."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from commands.catalog import Catalog
from config.settings import Settings
from executors.reconciler import ReconcilerService
from executors.reconciliation import (
    WaitingCall,
    backoff_seconds,
    describe_failure,
    publications,
    readdressed,
    waiting_calls,
)
from ratifier.ops import describe_unknown
from schemas.envelopes import Outcome, Stage, Status
from schemas.errors import OutcomeUnknown
from schemas.names import Topic
from telemetry.tracing import TraceParent
from tests.unit.conftest import NOW


def row(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "call_id": "c-first",
        "operation_id": "tenant-a:k",
        "outcome": {"call_id": "c-first", "trace_id": "t-first", "policy_version": "p1"},
    }
    body.update(kw)
    return body


def settled() -> Outcome:
    return Outcome(
        call_id="c-first",
        tool="propose_refund",
        tenant="tenant-a",
        status=Status.SUCCEEDED,
        stage=Stage.RECONCILE,
        result={"provider_ref": "prv_1"},
        operation_id="tenant-a:k",
        policy_version="p1",
        at=NOW,
        trace_id="t-first",
    )


def test_the_first_call_alone_when_no_retry_waits() -> None:
    assert waiting_calls(row(), []) == [WaitingCall(call_id="c-first", trace_id="t-first")]


def test_every_waiting_call_once_first_call_first() -> None:
    recorded = [
        WaitingCall(call_id="c-first", trace_id="t-first"),
        WaitingCall(call_id="c-retry", trace_id="t-retry"),
        WaitingCall(call_id="c-retry", trace_id="t-retry"),
        WaitingCall(call_id="c-third", trace_id=None),
    ]
    assert [c.call_id for c in waiting_calls(row(), recorded)] == [
        "c-first",
        "c-retry",
        "c-third",
    ]


def test_first_call_does_not_take_another_calls_trace() -> None:
    # A second owner marked the entry unknown with its own outcome (its call, its trace).
    taken_over = row(outcome={"call_id": "c-dup", "trace_id": "t-dup"})
    calls = waiting_calls(taken_over, [WaitingCall(call_id="c-dup", trace_id="t-dup")])
    assert calls == [
        WaitingCall(call_id="c-first", trace_id=None),
        WaitingCall(call_id="c-dup", trace_id="t-dup"),
    ]
    # … and the first call's own record, when there is one, gives it back its trace.
    recorded = [WaitingCall(call_id="c-first", trace_id="t-first")]
    assert waiting_calls(taken_over, recorded)[0].trace_id == "t-first"


def test_readdressed_is_the_same_outcome_under_each_call() -> None:
    outcome = settled()
    calls = [
        WaitingCall(call_id="c-first", trace_id="t-first"),
        WaitingCall(call_id="c-retry", trace_id="t-retry"),
        WaitingCall(call_id="c-untraced", trace_id=None),
    ]
    owed = readdressed(outcome, calls)
    assert [(o.call_id, o.trace_id) for o in owed] == [
        ("c-first", "t-first"),
        ("c-retry", "t-retry"),
        ("c-untraced", "t-first"),
    ]
    ignore = {"call_id", "trace_id"}
    assert all(o.model_dump(exclude=ignore) == outcome.model_dump(exclude=ignore) for o in owed)


def test_check_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_seconds(n, 1.0) for n in range(1, 5)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff_seconds(20, 1.0) == 300.0
    assert backoff_seconds(20, 1.0, cap=30.0) == 30.0


def test_owed_outcomes_are_published_each_in_its_calls_trace() -> None:
    """Each owed outcome is its own hop, keyed by its call; the executor's hop is its span's
    parent only for the call in the same trace, and is forgotten once published."""
    outcome = settled().model_copy(update={"operation_id": "tenant-a:k", "trace_id": "a" * 32})
    owed = readdressed(
        outcome,
        [
            WaitingCall(call_id="c-first", trace_id=None),
            WaitingCall(call_id="c-retry", trace_id="b" * 32),
        ],
    )
    executor_hop = TraceParent(trace_id="a" * 32, span_id="1" * 16)
    parents = {"tenant-a:k": executor_hop, "tenant-a:other": executor_hop}
    first, retry = publications(owed, parents)
    assert [(e.topic, e.key, e.value) for e in first.emits] == [
        (Topic.OUTCOMES, "c-first", owed[0])
    ]
    assert (first.call_id, first.trace_id, first.parent) == ("c-first", "a" * 32, executor_hop)
    assert (retry.call_id, retry.trace_id, retry.parent) == ("c-retry", "b" * 32, None)
    assert first.observe and first.failure is None
    assert parents == {"tenant-a:other": executor_hop}


def test_describe_failure_is_bounded() -> None:
    text = describe_failure(OutcomeUnknown("provider timeout " + "x" * 1000))
    assert text.startswith("cannot tell: OutcomeUnknown: provider timeout")
    assert len(text) == 300


def test_ops_unknown_says_why_and_who_waits() -> None:
    waiting = {
        "operation_id": "tenant-a:k",
        "tool": "propose_refund",
        "call_id": "c-first",
        "escalated_at": None,
        "reconcile_attempts": 3,
        "last_check": "cannot tell: OutcomeUnknown: timeout",
        "last_checked_at": NOW - timedelta(seconds=5),
        "next_check_at": NOW + timedelta(seconds=8),
        "waiting_calls": ["c-first", "c-retry"],
    }
    escalated = {**waiting, "operation_id": "tenant-a:e", "escalated_at": NOW}
    text = "\n".join(describe_unknown([waiting, escalated], NOW))
    assert text.startswith("2 operations with an unknown outcome")
    assert "last check: cannot tell: OutcomeUnknown: timeout (5s ago)" in text
    assert "next check: in 8s" in text
    assert "waiting calls (2): c-first, c-retry" in text
    assert "ESCALATED" in text and "waits for `ratifier ops resolve`" in text


async def test_a_failed_cycle_says_why_and_a_later_one_recovers(catalog: Catalog) -> None:
    """A dependency error fails the cycle only (raised for the caller's retry), and readiness
    says why; the next successful cycle clears it."""
    service = ReconcilerService(Settings(), catalog)
    service.health.running()

    async def database_down() -> None:
        raise psycopg.OperationalError("connection refused")

    async def fine() -> str:
        return "done"

    with pytest.raises(psycopg.OperationalError):
        await service._cycle(database_down)
    ready, body = service.health.readiness()
    assert not ready
    assert body["why"] == "OperationalError: connection refused"
    assert service.health.liveness()[0]  # waiting, not wedged

    assert await service._cycle(fine) == "done"
    assert service.health.waiting is None


async def test_the_reconciler_starts_in_the_service_shell_and_waits_for_its_database(
    catalog: Catalog,
) -> None:
    """Schema check and topics first, then the tool hooks, the broker and the database, each
    retried while PostgreSQL or the broker is away (runtime/shell.py); the metrics port is
    the reconciler's."""
    service = ReconcilerService(Settings(), catalog)

    async def prepare() -> None:
        return None

    shell = service.shell(prepare, http_port=9103)
    assert [hook.name for hook in shell.on_startup] == [
        "schema and topics",
        "tool hooks",
        "broker",
        "database",
    ]
    assert shell.service == "reconciler" and shell.http_port == 9103
    assert shell.health is service.health and shell.stopping is service.stopping
    refused = psycopg.OperationalError("connection refused")
    assert isinstance(refused, shell.retry_on)
    assert not isinstance(ValueError("a bug"), shell.retry_on)  # a bug stops the start
