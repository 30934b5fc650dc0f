"""The OpenTelemetry side of tracing, imported only when an exporter is configured (see
``telemetry/tracing.py``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from telemetry.spans import AttributeValue, TraceParent, Tracer


class ChosenIds(RandomIdGenerator):
    """Random ids, except the trace id of a root span whose trace the pipeline already
    chose (a proposal without a `traceparent`: its outcome names the trace)."""

    next_trace_id: int | None = None

    def generate_trace_id(self) -> int:
        chosen = self.next_trace_id
        return chosen if chosen is not None else super().generate_trace_id()


class OtelTracer(Tracer):
    """Spans through the OpenTelemetry SDK, in the trace the record carries."""

    enabled = True

    def __init__(self, provider: TracerProvider, ids: ChosenIds) -> None:
        self._provider = provider
        self._ids = ids
        self._tracer = provider.get_tracer("ratifier")

    def record(
        self,
        *,
        stage: str,
        trace_id: str,
        parent: TraceParent | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue],
    ) -> str:
        context = None
        if parent is not None and parent.trace_id == trace_id:
            context = trace.set_span_in_context(
                trace.NonRecordingSpan(
                    trace.SpanContext(
                        trace_id=int(trace_id, 16),
                        span_id=int(parent.span_id, 16),
                        is_remote=True,
                        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
                    )
                )
            )
        else:
            # Start a root span in the chosen trace. Synchronous, so no other span can take
            # the id in between.
            self._ids.next_trace_id = int(trace_id, 16)
        try:
            span = self._tracer.start_span(
                stage,
                context=context,
                kind=trace.SpanKind.CONSUMER,
                start_time=start_ns,
                attributes={k: v for k, v in attributes.items() if v is not None},
            )
        finally:
            self._ids.next_trace_id = None
        span.end(end_time=end_ns)
        return f"{span.get_span_context().span_id:016x}"

    def shutdown(self) -> None:
        self._provider.shutdown()


def span_json(span: ReadableSpan, service: str) -> dict[str, Any]:
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "service": service,
        "trace_id": f"{context.trace_id:032x}" if context else None,
        "span_id": f"{context.span_id:016x}" if context else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
    }


class JsonLinesExporter(SpanExporter):
    """Appends one JSON span per line. One write per export keeps the lines of several
    processes sharing the file whole (append mode)."""

    def __init__(self, path: str, service: str) -> None:
        self._path = path
        self._service = service

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(json.dumps(span_json(s, self._service)) + "\n" for s in spans)
        with open(self._path, "a", encoding="utf-8") as out:
            out.write(text)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def otel_tracer(spec: str, *, endpoint: str, service: str) -> OtelTracer:
    """A tracer exporting to ``spec``: ``otlp``, ``console`` or ``jsonl:/path``."""
    ids = ChosenIds()
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"ratifier-{service}"}), id_generator=ids
    )
    if spec.startswith("jsonl:"):
        provider.add_span_processor(
            SimpleSpanProcessor(JsonLinesExporter(spec.removeprefix("jsonl:"), service))
        )
    elif spec == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return OtelTracer(provider, ids)
