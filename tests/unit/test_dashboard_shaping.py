"""The dashboard's pure shaping: filters, buckets, percentiles table, inbox selection, feed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dashboard import shaping
from dashboard.shaping import Filters
from schemas.errors import ApprovalExpired, InvalidArguments, ResourceNotFound

NOW = datetime(2026, 11, 29, 15, 30, 17, tzinfo=UTC)


def request_row(
    call_id: str,
    *,
    tenant: str = "tenant-a",
    expires_in: float = 300,
    at: datetime = NOW - timedelta(seconds=10),
    decision: str | None = None,
    **change: Any,
) -> dict[str, Any]:
    record = {
        "v": 1,
        "call_id": call_id,
        "operation_id": f"{tenant}:{call_id}",
        "tenant": tenant,
        "tool": "propose_refund",
        "arguments": {"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late"},
        "preview": ["propose_refund requested by agent-1", "amount_minor: 10"],
        "fingerprint": "f" * 64,
        "effect": "external_write",
        "policy_version": "p1",
        "requested_by": "agent-1",
        "expires_at": (NOW + timedelta(seconds=expires_in)).isoformat(),
        **change,
    }
    return {
        "call_id": call_id,
        "record_at": at,
        "record": record,
        "decision": decision,
        "decision_at": NOW if decision else None,
    }


def test_filters_parse_and_refuse_unknown_values() -> None:
    parsed = shaping.filters_from(
        {"window": "900", "tenant": "tenant-a", "status": "succeeded", "error_code": ""}
    )
    assert parsed == Filters(window_seconds=900, tenant="tenant-a", status="succeeded")
    assert parsed.bucket_seconds == 30
    assert shaping.filters_from({}) == Filters()
    for bad in (
        {"window": "61"},
        {"window": "soon"},
        {"tenant": "x'; drop"},
        {"status": "great"},
        {"error_code": "oops"},
        {"tool": "t" * 200},
    ):
        with pytest.raises(InvalidArguments):
            shaping.filters_from(bad)


def test_buckets_cover_the_window_and_empty_ones_are_kept() -> None:
    filters = Filters(window_seconds=900)  # 30 buckets of 30 s
    since = shaping.series_since(NOW, filters)
    assert since == datetime(2026, 11, 29, 15, 15, 30, tzinfo=UTC)
    assert shaping.bucket_start(NOW, 30) == datetime(2026, 11, 29, 15, 30, tzinfo=UTC)
    rows = [
        {"bucket": since, "status": "succeeded", "n": 3},
        {"bucket": since, "status": "denied", "n": 1},
        {"bucket": shaping.bucket_start(NOW, 30), "status": "succeeded", "n": 2},
        {"bucket": since - timedelta(seconds=30), "status": "failed", "n": 9},  # before: dropped
    ]
    series = shaping.fill_series(rows, since=since, bucket_seconds=30, count=30)
    assert len(series) == 30
    assert series[0] == {"at": "2026-11-29T15:15:30Z", "counts": {"succeeded": 3, "denied": 1}}
    assert series[-1]["counts"] == {"succeeded": 2}
    assert all(b["counts"] == {} for b in series[1:-1])


def test_breakdown_counts_per_status_code_tenant_and_tool() -> None:
    names = ("tenant", "tool", "status", "error_code", "n")
    rows = [
        dict(zip(names, row, strict=True))
        for row in (
            ("tenant-a", "get_payment", "succeeded", None, 5),
            ("tenant-a", "propose_refund", "denied", "policy_denied", 2),
            ("", "get_payment", "rejected", "unauthenticated", 1),
            ("tenant-a", "get_payment", "failed", "permanent_error", 1),
        )
    ]
    counted = shaping.breakdown(rows)
    assert counted.total == 9
    assert counted.totals == {"succeeded": 5, "denied": 2, "rejected": 1, "failed": 1}
    assert counted.codes == {"policy_denied": 2, "unauthenticated": 1, "permanent_error": 1}
    first = counted.rows[0]
    assert (first["tenant"], first["tool"], first["total"]) == ("tenant-a", "get_payment", 6)
    assert first["by_status"] == {"succeeded": 5, "failed": 1}
    assert first["by_code"] == {"permanent_error": 1}
    assert counted.rows[-1]["tenant"] is None  # an unverified caller has no tenant
    assert shaping.facets(rows)["tenant"] == ["tenant-a"]
    assert shaping.facets(rows)["error_code"] == [
        "permanent_error",
        "policy_denied",
        "unauthenticated",
    ]


def test_latency_table_lists_every_stage_in_pipeline_order() -> None:
    table = shaping.latency_table(
        [
            {"stage": "end_to_end", "n": 4, "p50": 120.04, "p95": 900.0, "p99": 990.0},
            {"stage": "validate", "n": 4, "p50": 1.26, "p95": 3.0, "p99": -0.2},
        ]
    )
    assert [r["stage"] for r in table] == [
        "validate",
        "authorize",
        "approve_commit",
        "execute",
        "end_to_end",
    ]
    assert table[0] == {**table[0], "n": 4, "p50": 1.3, "p95": 3.0, "p99": 0.0}
    assert table[1]["n"] == 0 and table[1]["p95"] is None
    assert table[-1]["p50"] == 120.0


def test_inbox_keeps_pending_of_the_tenant_soonest_first() -> None:
    rows = [
        request_row("ap-late", expires_in=600),
        request_row("ap-soon", expires_in=60, decision="approve"),
        request_row("ap-gone", expires_in=-1),
        request_row("ap-other", tenant="tenant-b"),
        {**request_row("ap-bad"), "record": {"call_id": "ap-bad", "garbage": True}},
        # the same call requested again (an edit re-requested): the newest request counts
        request_row("ap-late", expires_in=900, at=NOW - timedelta(seconds=5), fingerprint="e" * 64),
    ]
    pending = shaping.pending_requests(rows, now=NOW, tenant="tenant-a")
    assert [p.request.call_id for p in pending] == ["ap-soon", "ap-late"]
    assert pending[1].request.fingerprint == "e" * 64
    shown = pending[0].to_json(NOW)
    assert shown["seconds_left"] == 60.0
    assert shown["decision"] == "approve"
    # Amounts in the feed's format (the currency is looked up by dashboard.reads).
    assert shown["preview"] == ["propose_refund requested by agent-1", "amount: 10 (minor units)"]
    every = shaping.pending_requests(rows, now=NOW, tenant=None)
    assert {p.request.call_id for p in every} == {"ap-soon", "ap-late", "ap-other"}


def test_the_request_to_decide_is_tenant_scoped_and_unexpired() -> None:
    rows = [
        request_row("ap-1"),
        request_row("ap-old", expires_in=-5),
        request_row("ap-b", tenant="tenant-b"),
    ]
    found = shaping.request_to_decide(rows, call_id="ap-1", tenant="tenant-a", now=NOW)
    assert found.call_id == "ap-1"
    with pytest.raises(ApprovalExpired):
        shaping.request_to_decide(rows, call_id="ap-old", tenant="tenant-a", now=NOW)
    for call_id in ("ap-b", "ap-none"):  # another tenant's looks like an absent one
        with pytest.raises(ResourceNotFound):
            shaping.request_to_decide(rows, call_id=call_id, tenant="tenant-a", now=NOW)


def test_feed_items_for_outcomes_and_decisions() -> None:
    base = {"kafka_partition": 1, "kafka_offset": 7, "record_at": NOW, "call_id": "ap-1"}
    outcome = shaping.feed_item(
        {
            **base,
            "stream": "outcomes",
            "tenant": "tenant-a",
            "tool": "propose_refund",
            "status": "succeeded",
            "error_code": None,
            "record": {
                "stage": "execute",
                "result": {"refund_id": "re_1", "amount_minor": 10, "currency": "EUR", "x": [1]},
                "approval": {"approver": "boss"},
                "resource_id": "re_1",
            },
        }
    )
    assert outcome["id"] == "outcomes:1:7"
    assert outcome["at"] == "2026-11-29T15:30:17Z"
    assert (outcome["kind"], outcome["status"], outcome["approver"]) == (
        "outcome",
        "succeeded",
        "boss",
    )
    assert outcome["detail"] == "re_1 · 0.10 EUR"
    assert shaping.money(123456, "EUR") == "1,234.56 EUR"
    assert shaping.money(500, "JPY") == "500 JPY"
    assert shaping.money(-1005, "KWD") == "-1.005 KWD"
    assert shaping.money(7, None) == "7 (minor units)"
    decision = shaping.feed_item(
        {
            **base,
            "stream": "approvals.decided",
            "tenant": "tenant-a",
            "tool": "propose_refund",
            "status": None,
            "error_code": None,
            "record": {
                "decision": "approve",
                "approver": {"token": "masked", "verified": True, "sub": "boss"},
            },
        }
    )
    assert (decision["kind"], decision["status"], decision["approver"]) == (
        "decision",
        "decision:approve",
        "boss",
    )


def test_operations_carry_state_and_history() -> None:
    ledger = [
        {
            "tenant": "tenant-a",
            "operation_id": "tenant-a:k1",
            "call_id": "c1",
            "tool": "propose_refund",
            "status": "unknown",
            "reconcile_attempts": 8,
            "next_check_at": None,
            "escalated_at": NOW,
            "updated_at": NOW,
            "error_code": "timeout",
        },
        {
            "tenant": "tenant-a",
            "operation_id": "tenant-a:k2",
            "call_id": "c2",
            "tool": "propose_refund",
            "status": "unknown",
            "reconcile_attempts": 1,
            "next_check_at": NOW,
            "escalated_at": None,
            "updated_at": NOW,
        },
    ]
    names = ("tenant", "call_id", "at", "kind", "detail")
    history = [
        dict(zip(names, row, strict=True))
        for row in (
            ("tenant-a", "c1", NOW, "executed", {"status": "unknown", "code": "timeout"}),
            ("tenant-a", "c1", NOW, "escalated", {"attempts": 8}),
            ("tenant-b", "c1", NOW, "escalated", {}),
        )
    ]
    items = shaping.operations(ledger, history)
    assert [i["state"] for i in items] == ["escalated", "reconciling"]
    assert [(e["kind"], e["summary"]) for e in items[0]["history"]] == [
        ("executed", "unknown (timeout)"),
        ("escalated", "escalated to humans after 8 check(s)"),
    ]
    assert items[1]["history"] == []


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN, fonts or scripts from the internet: the page works on an offline machine."""
    from importlib import resources

    static = resources.files("dashboard").joinpath("static")
    names = {"index.html", "app.css", "app.js"}
    assert names <= {entry.name for entry in static.iterdir()}
    for name in names:
        text = static.joinpath(name).read_text(encoding="utf-8")
        found = text.replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in found and "https://" not in found and "//cdn" not in found, name
        assert "innerHTML" not in found, name  # data goes through textContent only


def test_inbox_amounts_are_shown_like_the_feed() -> None:
    (item,) = shaping.pending_requests([request_row("c-1")], now=NOW, tenant="tenant-a")
    assert item.to_json(NOW)["preview"] == [
        "propose_refund requested by agent-1",
        "amount: 10 (minor units)",
    ]
    shown = item.with_currency("EUR").to_json(NOW)
    assert shown["preview"] == ["propose_refund requested by agent-1", "amount: 0.10 EUR"]
    # The same formatter as the feed's result detail.
    assert shaping.money(5, "EUR") == "0.05 EUR"
    assert shaping.currency_of({"currency": "JPY"}, {"currency": "EUR"}) == "JPY"
    assert shaping.currency_of({"amount_minor": 5}, {"currency": "EUR"}) == "EUR"
    assert shaping.currency_of({}, None) is None
