"""Every service's `/metrics` moves while calls flow, and one trace follows each call from
the proposal's `traceparent` through every stage to its outcomes (docs/observability.md)."""

from __future__ import annotations

import json
import random
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ratifier.topics import delete_topics
from runtime.clients import kafka_producer
from schemas.envelopes import ApprovalVerdict
from schemas.names import (
    AUDIT_SINK_GROUP,
    EXECUTOR_GROUP,
    RECONCILER_GROUP,
    STREAMS_APP_ID,
    Topic,
)
from tests.e2e.approvals_kit import REFUND, decide, token
from tests.e2e.conftest import Pipeline, SigningKeys, free_port, start_pipeline
from tests.e2e.executor_kit import refund_command, seed_payments
from tests.e2e.test_reconciliation import faults, park_leftovers
from tests.services import context_token, outcomes_by_call, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Observed:
    pipeline: Pipeline
    spans: Path
    metrics: dict[str, str]  # service -> /metrics url


@pytest.fixture(scope="module")
def observed(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    spans = tmp_path_factory.mktemp("telemetry") / "spans.jsonl"
    executor_port, reconciler_port, audit_port = free_port(), free_port(), free_port()
    pipeline = start_pipeline(
        signing_keys,
        f"telemetry-{uuid.uuid4().hex[:4]}",
        audit_sink=True,
        RATIFIER_OBSERVABILITY__AUDIT_METRICS_PORT=str(audit_port),
        RATIFIER_OBSERVABILITY__OTEL_EXPORTER=f"jsonl:{spans}",
        RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT=str(executor_port),
        RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS="3",
        RATIFIER_EXECUTOR__RETRY_ATTEMPTS="2",
    )
    try:
        seed_payments(pipeline.settings)
        park_leftovers(pipeline)
        pipeline.start(
            "reconciler",
            "reconciler",
            RATIFIER_RECONCILER__BACKOFF_SECONDS="0.2",
            RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT=str(reconciler_port),
        )
        yield Observed(
            pipeline=pipeline,
            spans=spans,
            metrics={
                "streams": f"http://127.0.0.1:{pipeline.http_port}/metrics",
                "join": f"http://127.0.0.1:{pipeline.join_http_port}/metrics",
                "executor": f"http://127.0.0.1:{executor_port}/metrics",
                "reconciler": f"http://127.0.0.1:{reconciler_port}/metrics",
                "audit": f"http://127.0.0.1:{audit_port}/metrics",
            },
        )
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def scrape(url: str, timeout: float = 30) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.status == 200
                text = response.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape_until(url: str, holds: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    """Scrape until ``holds`` (gauges refresh every few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if holds(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def new_traceparent() -> tuple[str, str, bytes]:
    trace_id, span_id = f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01".encode()


async def publish_traced(
    pipeline: Pipeline, topic: Topic, records: list[tuple[str, bytes, bytes]]
) -> None:
    producer = kafka_producer(pipeline.settings)
    await producer.start()
    try:
        for key, body, traceparent in records:
            await producer.send(
                pipeline.settings.topic(topic),
                key=key.encode(),
                value=body,
                headers=[("traceparent", traceparent)],
            )
        await producer.flush()
    finally:
        await producer.stop()


def proposal(
    pipeline: Pipeline, tool: str, arguments: dict[str, Any], roles: tuple[str, ...]
) -> bytes:
    call_id = f"tel-{uuid.uuid4().hex[:12]}"
    return json.dumps(
        {
            "v": 1,
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "context": context_token(pipeline.settings, sub="agent-1", roles=roles),
            "proposed_at": datetime.now(UTC).isoformat(),
        }
    ).encode()


def outcomes_of(
    pipeline: Pipeline, done: Callable[[dict[str, list[dict[str, Any]]]], bool]
) -> dict[str, list[dict[str, Any]]]:
    records = run(
        read_until(
            pipeline.settings,
            [Topic.OUTCOMES],
            lambda recs: done(outcomes_by_call(recs)),
            timeout=90,
        )
    )
    return outcomes_by_call(records)


def spans_of(path: Path, trace_id: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        span = json.loads(line)
        if span["trace_id"] == trace_id:
            found.setdefault(span["name"], []).append(span)
    for spans in found.values():
        spans.sort(key=lambda s: s["start_ns"])
    return found


def test_metrics_move_and_one_trace_follows_each_call(observed: Observed) -> None:
    pipeline = observed.pipeline
    before = {name: scrape(url) for name, url in observed.metrics.items()}

    # A read that executes, a call the validator rejects, and a refund a human approves:
    # each proposed with the caller's own traceparent.
    read_trace, read_parent, read_header = new_traceparent()
    bad_trace, bad_parent, bad_header = new_traceparent()
    refund_trace, refund_parent, refund_header = new_traceparent()
    read = proposal(pipeline, "get_payment", {"payment_id": "pay_A1001"}, ("support",))
    bad = proposal(pipeline, "no_such_tool", {}, ("support",))
    refund = proposal(pipeline, "propose_refund", dict(REFUND), ("refund",))
    ids = {name: json.loads(body)["call_id"] for name, body in [("read", read), ("bad", bad)]}
    ids["refund"] = json.loads(refund)["call_id"]
    run(
        publish_traced(
            pipeline,
            Topic.PROPOSED,
            [
                (ids["read"], read, read_header),
                (ids["bad"], bad, bad_header),
                (ids["refund"], refund, refund_header),
            ],
        )
    )
    seen = outcomes_of(
        pipeline,
        lambda found: ids["read"] in found and ids["bad"] in found and ids["refund"] in found,
    )
    assert seen[ids["read"]][-1]["status"] == "succeeded"
    assert (seen[ids["bad"]][-1]["status"], seen[ids["bad"]][-1]["stage"]) == (
        "rejected",
        "validate",
    )
    (awaiting,) = seen[ids["refund"]]
    assert awaiting["status"] == "awaiting_approval"
    request = run(
        read_until(
            pipeline.settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: any(json.loads(r.value)["call_id"] == ids["refund"] for r in recs),
        )
    )
    (requested,) = [
        json.loads(r.value) for r in request if json.loads(r.value)["call_id"] == ids["refund"]
    ]
    decide(pipeline, requested, token(pipeline.settings, "boss"), ApprovalVerdict.APPROVE)
    outcomes_of(
        pipeline,
        lambda found: any(o["status"] == "succeeded" for o in found.get(ids["refund"], [])),
    )

    # A refund whose provider response is lost: unknown, then reconciled.
    faults(pipeline, drop_after=1)
    lost_trace, lost_parent, lost_header = new_traceparent()
    lost = refund_command(f"tel-lost-{uuid.uuid4().hex[:10]}")
    run(
        publish_traced(
            pipeline, Topic.COMMITTED, [(lost.operation_id, lost.to_bytes(), lost_header)]
        )
    )
    seen = outcomes_of(
        pipeline,
        lambda found: (
            any(o["status"] == "succeeded" for o in found.get(ids["refund"], []))
            and any(o["stage"] == "reconcile" for o in found.get(lost.call_id, []))
        ),
    )
    faults(pipeline)

    # trace_id on every outcome, and it is the caller's trace.
    for call_id, trace_id in [
        (ids["read"], read_trace),
        (ids["bad"], bad_trace),
        (ids["refund"], refund_trace),
        (lost.call_id, lost_trace),
    ]:
        assert {o["trace_id"] for o in seen[call_id]} == {trace_id}, seen[call_id]
    assert [o["stage"] for o in seen[lost.call_id]] == ["execute", "reconcile"]

    # One span per stage, each the child of the previous hop, in the caller's trace.
    def chain(trace_id: str, names: list[str], first_parent: str) -> None:
        spans = spans_of(observed.spans, trace_id)
        parent = first_parent
        for name in names:
            span = spans[name].pop(0) if spans.get(name) else None
            assert span is not None, (name, spans)
            assert span["parent_span_id"] == parent, (name, span)
            parent = span["span_id"]

    deadline = time.monotonic() + 15  # the reconciler's span is written as it publishes
    while True:
        try:
            # A read is committed by the authorizer: no approval-join hop.
            chain(read_trace, ["validate", "authorize", "execute"], read_parent)
            assert "approve" not in spans_of(observed.spans, read_trace)
            chain(bad_trace, ["validate"], bad_parent)
            # The human's decision continues the call's trace from the approval request.
            chain(
                refund_trace,
                ["validate", "authorize", "approve", "approve", "execute"],
                refund_parent,
            )
            chain(lost_trace, ["execute", "reconcile"], lost_parent)
            break
        except (AssertionError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    (validate,) = spans_of(observed.spans, bad_trace)["validate"]
    assert validate["attributes"]["ratifier.error_code"] == "unknown_tool"
    assert validate["attributes"]["ratifier.call_id"] == ids["bad"]

    # The counters moved on every service, and the lag gauges exist. `ratifier streams` runs
    # the stages and the approval-join as two processes, each with its own /metrics.
    streams_group = pipeline.settings.group(STREAMS_APP_ID)
    join = scrape_until(
        observed.metrics["join"],
        lambda s: any(
            n == "ratifier_consumer_lag" and ("group", streams_group) in labels for n, labels in s
        ),
    )
    streams = scrape(observed.metrics["streams"])
    executor_group = pipeline.settings.group(EXECUTOR_GROUP)
    executor = scrape_until(
        observed.metrics["executor"],
        lambda s: any(
            n == "ratifier_consumer_lag" and ("group", executor_group) in labels for n, labels in s
        ),
    )
    reconciler_group = pipeline.settings.group(RECONCILER_GROUP)
    reconciler = scrape_until(
        observed.metrics["reconciler"],
        lambda s: any(
            n == "ratifier_consumer_lag" and ("group", reconciler_group) in labels
            for n, labels in s
        ),
    )
    moved = {
        "streams": (
            streams,
            [
                ("ratifier_records_total", {"stage": "validate", "status": "rejected"}),
                ("ratifier_records_total", {"stage": "validate", "status": "forwarded"}),
                ("ratifier_records_total", {"stage": "authorize", "status": "forwarded"}),
                ("ratifier_records_total", {"stage": "authorize", "status": "committed"}),
                ("ratifier_errors_total", {"stage": "validate", "code": "unknown_tool"}),
                ("ratifier_stage_seconds_count", {"stage": "authorize"}),
            ],
        ),
        "join": (
            join,
            [
                ("ratifier_records_total", {"stage": "approve", "status": "awaiting_approval"}),
                ("ratifier_records_total", {"stage": "approve", "status": "committed"}),
            ],
        ),
        "executor": (
            executor,
            [
                ("ratifier_records_total", {"stage": "execute", "status": "succeeded"}),
                ("ratifier_records_total", {"stage": "execute", "status": "unknown"}),
                ("ratifier_errors_total", {"stage": "execute", "code": "timeout"}),
                ("ratifier_dedup_total", {"layer": "redis", "result": "claimed"}),
                ("ratifier_dedup_total", {"layer": "ledger", "result": "claimed"}),
                ("ratifier_stage_seconds_count", {"stage": "execute"}),
            ],
        ),
        "reconciler": (
            reconciler,
            [
                ("ratifier_records_total", {"stage": "reconcile", "status": "succeeded"}),
                ("ratifier_reconciliations_total", {"result": "settled"}),
            ],
        ),
    }
    for service, (now, counters) in moved.items():
        old = before[service]
        for name, labels in counters:
            assert value(now, name, **labels) > value(old, name, **labels), (name, labels)

    assert ("ratifier_reconciliation_queue_size", frozenset()) in reconciler
    assert ("ratifier_reconciliation_oldest_age_seconds", frozenset()) in reconciler

    audit_group = pipeline.settings.group(AUDIT_SINK_GROUP)
    audit = scrape_until(
        observed.metrics["audit"],
        lambda s: any(
            n == "ratifier_consumer_lag" and ("group", audit_group) in labels for n, labels in s
        ),
    )
    written = ("ratifier_records_total", {"stage": "audit", "status": "written"})
    assert value(audit, written[0], **written[1]) > value(before["audit"], written[0], **written[1])
