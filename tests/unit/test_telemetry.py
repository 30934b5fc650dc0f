"""traceparent parsing and formatting, metric helpers, stage statuses, span export, and the
Grafana dashboard's expressions."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from approvals.signing import verify_decision
from commands.catalog import Catalog
from commands.policy import PolicySet
from commands.validate import Limits
from config.settings import Settings
from schemas.envelopes import (
    ApprovalVerdict,
    DeadLetter,
    Outcome,
    SourcePosition,
    Stage,
    Status,
    ValidatedCall,
)
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.approval import on_authorized, on_decided, on_tick
from streams.authorizer import on_validated
from streams.emit import Emit, outcome
from streams.observe import StageObserver, status_of, trace_id_in
from streams.validator import on_proposed
from telemetry.metrics import METRIC_NAMES, count_dedup, observe_record, observe_records
from telemetry.tracing import (
    TraceParent,
    Tracer,
    format_traceparent,
    parse_traceparent,
    trace_id_of,
    traceparent_of,
    tracer_from,
)
from tests.unit.conftest import KEYS, SIGNING
from tests.unit.test_approval import RULES, authorized, decision
from tests.unit.test_stages import PAYMENT, SOURCE, FakeStore, proposed, validated

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_valid_traceparent_is_parsed() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == TraceParent(
        trace_id=TRACE, span_id=SPAN, sampled=True
    )
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00".encode()) == TraceParent(
        trace_id=TRACE, span_id=SPAN, sampled=False
    )
    # A later version may append fields; its first four are read.
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-01-extra") == TraceParent(
        trace_id=TRACE, span_id=SPAN
    )


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        b"\xff\xfe",
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case
        f"00-{TRACE[:-1]}-{SPAN}-01",  # short trace id
        f"00-{TRACE}-{SPAN}0-01",  # long span id
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00_{TRACE}_{SPAN}_01",
    ],
)
def test_malformed_traceparent_is_none(header: str | bytes | None) -> None:
    assert parse_traceparent(header) is None


def test_format_round_trips() -> None:
    header = format_traceparent(TRACE, SPAN)
    assert header == f"00-{TRACE}-{SPAN}-01".encode()
    assert parse_traceparent(header) == TraceParent(trace_id=TRACE, span_id=SPAN)


def test_headers_as_pairs_or_mapping() -> None:
    pairs = [("other", b"x"), ("traceparent", format_traceparent(TRACE, SPAN))]
    assert traceparent_of(pairs) == TraceParent(trace_id=TRACE, span_id=SPAN)
    assert traceparent_of({"traceparent": f"00-{TRACE}-{SPAN}-01"}) is not None
    assert traceparent_of(None) is None
    assert traceparent_of([("traceparent", b"nonsense")]) is None
    assert trace_id_of(pairs) == TRACE


def test_missing_or_malformed_header_starts_a_new_trace() -> None:
    first, second = trace_id_of(None), trace_id_of([("traceparent", b"bad")])
    assert HEX32.match(first) and HEX32.match(second)
    assert first != second


def test_tracer_without_exporter_only_makes_span_ids() -> None:
    tracer = tracer_from(Settings(observability={"otel_exporter": ""}), service="test")
    assert type(tracer) is Tracer and not tracer.enabled
    ids = {
        tracer.record(
            stage="validate", trace_id=TRACE, parent=None, start_ns=0, end_ns=1, attributes={}
        )
        for _ in range(50)
    }
    assert len(ids) == 50 and all(HEX16.match(i) for i in ids)


def test_otel_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="otel_exporter"):
        Settings(observability={"otel_exporter": "zipkin"})


def test_jsonl_exporter_writes_spans_in_the_chosen_trace(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracer = tracer_from(Settings(observability={"otel_exporter": f"jsonl:{path}"}), service="test")
    try:
        root = tracer.record(
            stage="validate",
            trace_id=TRACE,
            parent=None,
            start_ns=1_000,
            end_ns=2_000,
            attributes={"ratifier.call_id": "c-1", "ratifier.error_code": None},
        )
        child = tracer.record(
            stage="authorize",
            trace_id=TRACE,
            parent=TraceParent(trace_id=TRACE, span_id=root),
            start_ns=3_000,
            end_ns=4_000,
            attributes={},
        )
        remote = tracer.record(
            stage="execute",
            trace_id=TRACE,
            parent=TraceParent(trace_id=TRACE, span_id=SPAN),
            start_ns=5_000,
            end_ns=6_000,
            attributes={},
        )
    finally:
        tracer.shutdown()
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(s["name"], s["trace_id"], s["span_id"], s["parent_span_id"]) for s in spans] == [
        ("validate", TRACE, root, None),
        ("authorize", TRACE, child, root),
        ("execute", TRACE, remote, SPAN),
    ]
    assert spans[0]["attributes"] == {"ratifier.call_id": "c-1"}
    assert (spans[0]["start_ns"], spans[0]["end_ns"]) == (1_000, 2_000)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_observe_record_counts_status_errors_and_latency() -> None:
    before = (
        _sample("ratifier_records_total", stage="unit", status="rejected"),
        _sample("ratifier_errors_total", stage="unit", code="unknown_tool"),
        _sample("ratifier_stage_seconds_count", stage="unit"),
        _sample("ratifier_stage_seconds_bucket", stage="unit", le="0.005"),
    )
    observe_record("unit", status="rejected", code="unknown_tool", seconds=0.002)
    observe_record("unit", status="rejected", code=None, seconds=3.0)
    after = (
        _sample("ratifier_records_total", stage="unit", status="rejected"),
        _sample("ratifier_errors_total", stage="unit", code="unknown_tool"),
        _sample("ratifier_stage_seconds_count", stage="unit"),
        _sample("ratifier_stage_seconds_bucket", stage="unit", le="0.005"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 1, 2, 1]


def test_a_batch_s_records_observed_at_once_are_n_observations() -> None:
    def samples(stage: str) -> list[float]:
        return [
            _sample("ratifier_stage_seconds_count", stage=stage),
            _sample("ratifier_stage_seconds_sum", stage=stage),
            *(
                _sample("ratifier_stage_seconds_bucket", stage=stage, le=le)
                for le in ("0.005", "0.025", "0.1", "+Inf")
            ),
            _sample("ratifier_records_total", stage=stage, status="rejected"),
        ]

    for seconds in (0.0072, 0.02, 99.0):
        for _ in range(3):
            observe_record("unit-one", status="rejected", code=None, seconds=seconds)
        observe_records("unit-many", status="rejected", code=None, seconds=seconds, n=3)
    assert samples("unit-many") == pytest.approx(samples("unit-one"))
    assert samples("unit-many")[0] == 9


def test_dedup_counter() -> None:
    before = _sample("ratifier_dedup_total", layer="unit", result="hit")
    count_dedup("unit", "hit")
    assert _sample("ratifier_dedup_total", layer="unit", result="hit") == before + 1


def _rejected(trace_id: str | None = "t" * 32) -> Emit:
    return outcome(
        call_id="c-1",
        tool="x",
        tenant=None,
        status=Status.REJECTED,
        stage=Stage.VALIDATE,
        code=ErrorCode.UNKNOWN_TOOL,
        at=NOW,
        trace_id=trace_id,
    )


def test_status_of_what_a_stage_emitted() -> None:
    letter = Emit(
        topic=Topic.DEADLETTER,
        key=None,
        value=DeadLetter(
            call_id=None,
            reason="bad",
            raw_base64="",
            source=SourcePosition(topic="t", partition=0, offset=0),
            at=NOW,
        ),
    )
    validated = Emit(
        topic=Topic.VALIDATED,
        key="c-1",
        value=ValidatedCall(
            call_id="c-1",
            idempotency_key="c-1",
            tool="get_payment",
            arguments={},
            context="x",
            proposed_at=NOW,
            validated_at=NOW,
            trace_id=TRACE,
        ),
    )
    assert status_of((_rejected(), letter)) == ("rejected", "unknown_tool")
    assert status_of((letter,)) == ("deadletter", None)
    assert status_of((validated,)) == ("forwarded", None)
    assert status_of(()) == ("ignored", None)
    assert trace_id_in((letter, validated)) == TRACE
    assert trace_id_in((letter,)) is None


def test_observer_keeps_the_records_trace_and_names_its_span_as_next_parent() -> None:
    observer = StageObserver(Tracer())
    parent = TraceParent(trace_id=TRACE, span_id=SPAN)
    hop = parse_traceparent(
        observer.finished("unit", (_rejected(TRACE),), parent=parent, start_ns=0, end_ns=1)
    )
    assert hop is not None and hop.trace_id == TRACE and hop.span_id != SPAN
    # No trace on the record and no header: a new trace.
    fresh = parse_traceparent(observer.finished("unit", (), parent=None, start_ns=0, end_ns=1))
    assert fresh is not None and fresh.trace_id != TRACE
    # An explicit trace (the approval-join's call) wins over a decision's own trace.
    other = TraceParent(trace_id="a" * 32, span_id=SPAN)
    chosen = parse_traceparent(
        observer.finished("unit", (), parent=other, start_ns=0, end_ns=1, trace_id=TRACE)
    )
    assert chosen is not None and chosen.trace_id == TRACE


def test_every_outcome_model_has_a_trace_id_field() -> None:
    assert "trace_id" in Outcome.model_fields


def test_grafana_dashboard_refers_only_to_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/ratifier-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["schemaVersion"] >= 38
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    assert len(panels) >= 7
    seen: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\bratifier_[a-z_]+\b", target["expr"]))
            assert names, (panel["title"], target["expr"])
            assert names <= METRIC_NAMES, (panel["title"], names - METRIC_NAMES)
            seen |= names
    # Every metric family is on the dashboard.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in METRIC_NAMES}
    assert families <= {re.sub(r"_(bucket|sum|count)$", "", n) for n in seen}


def test_prometheus_scrape_config_names_the_default_ports() -> None:
    text = (ROOT / "deploy/prometheus/prometheus.yml").read_text()
    defaults = Settings()
    for port in (
        defaults.streams.http_port,
        defaults.observability.executor_metrics_port,
        defaults.observability.reconciler_metrics_port,
    ):
        assert f"127.0.0.1:{port}" in text


async def test_every_stream_stage_outcome_carries_the_calls_trace(
    catalog: Catalog, policies: PolicySet
) -> None:
    """Validator (rejection, malformed), authorizer (unauthenticated, denied) and the
    approval-join (awaiting, rejected, expired) all write the call's trace id."""
    seen: list[Outcome] = []
    for raw in (proposed(tool="no_such_tool"), proposed(v=7)):
        emits = on_proposed(
            raw, source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id=TRACE
        )
        seen += [e.value for e in emits if isinstance(e.value, Outcome)]
    store = FakeStore(PAYMENT)
    for call in (
        validated(context="forged.token.here", trace_id=TRACE),
        validated(tenant="tenant-b", trace_id=TRACE),
    ):
        emits = await on_validated(
            call, catalog=catalog, keys=KEYS, policies=policies, fetch=store.fetch, now=NOW
        )
        seen += [e.value for e in emits if isinstance(e.value, Outcome)]
    asked = authorized().model_copy(update={"trace_id": TRACE})
    tool = catalog.get("propose_refund")
    waiting = on_authorized(None, asked, tool=tool, now=NOW, rules=RULES)
    assert waiting.state is not None
    rejection = decision(asked, ApprovalVerdict.REJECT)
    rejected = on_decided(
        waiting.state,
        rejection,
        verify_decision(rejection, kafka_key=asked.call_id, keys=SIGNING, now=NOW),
        call_id=asked.call_id,
        tool=tool,
        now=NOW,
        rules=RULES,
    )
    expired = on_tick(waiting.state, now=NOW + timedelta(days=1), rules=RULES)
    for step in (waiting, rejected, expired):
        seen += [e.value for e in step.emits if isinstance(e.value, Outcome)]
    assert [(o.stage.value, o.status.value) for o in seen] == [
        ("validate", "rejected"),
        ("validate", "rejected"),
        ("authorize", "denied"),
        ("authorize", "denied"),
        ("approve", "awaiting_approval"),
        ("approve", "rejected"),
        ("approve", "expired"),
    ]
    assert {o.trace_id for o in seen} == {TRACE}
