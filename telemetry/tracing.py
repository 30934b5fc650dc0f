"""W3C trace context across Kafka, and one OpenTelemetry span per stage per record.

Every record the pipeline publishes carries a ``traceparent`` header
(``00-<trace id>-<span id>-<flags>``). A stage reads the incoming header, keeps its trace id
(or starts a new trace when the header is missing or malformed), records its own span whose
parent is the incoming span, and writes a header naming its own span as the parent of the
next hop. The trace id is also written on every outcome.

Spans are exported only when ``RATIFIER_OBSERVABILITY__OTEL_EXPORTER`` is set:

- ``''`` (default): no OpenTelemetry at all; a stage only generates span ids for headers.
- ``otlp``: OTLP/HTTP to ``RATIFIER_OBSERVABILITY__OTEL_ENDPOINT`` (batched).
- ``console``: one JSON span per span on stdout (batched).
- ``jsonl:/path``: one JSON object per span, one per line, appended as each span ends (tests).

Usage::

    tracer = tracer_from(settings, service="executor")
    parent = traceparent_of(record.headers)          # None when missing or malformed
    trace_id = parent.trace_id if parent else new_trace_id()
    ... work ...
    span_id = tracer.record(stage="execute", trace_id=trace_id, parent=parent,
                            start_ns=t0, end_ns=time.time_ns(), attributes={...})
    headers = [(TRACEPARENT_HEADER, format_traceparent(trace_id, span_id))]
    tracer.shutdown()                                 # flushes the exporter
"""

from __future__ import annotations

import random  # trace and span ids need uniqueness, not secrecy; os.urandom is slow
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from config.settings import Settings
from schemas.names import TRACEPARENT_HEADER
from telemetry.spans import AttributeValue, TraceParent, Tracer, new_span_id

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def new_trace_id() -> str:
    return f"{random.getrandbits(128) or 1:032x}"


def parse_traceparent(value: str | bytes | bytearray | None) -> TraceParent | None:
    """The W3C ``traceparent`` in ``value``, or None when it is missing or malformed
    (version ``ff``, all-zero ids, wrong lengths or case, or a version-00 header with
    trailing data)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        value = bytes(value)
        # Only a header of a plausible size is remembered (a `traceparent` is 55 bytes).
        return _parsed_header(value) if len(value) <= 128 else _parsed_header.__wrapped__(value)
    return _parsed(value)


# A consumed record's header is parsed by its handler and again by its hop (a stage's batch
# is at most 500 records); TraceParent is frozen, so one parse can be shared.
@lru_cache(maxsize=2048)
def _parsed_header(value: bytes) -> TraceParent | None:
    try:
        return _parsed(value.decode("ascii"))
    except UnicodeDecodeError:
        return None


def _parsed(value: str) -> TraceParent | None:
    found = _TRACEPARENT.match(value.strip())
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE:
        return None
    if span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id=trace_id, span_id=span_id, sampled=bool(int(flags, 16) & 1))


def format_traceparent(trace_id: str, span_id: str, *, sampled: bool = True) -> bytes:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}".encode()


def traceparent_of(headers: Any) -> TraceParent | None:
    """The parent named by the ``traceparent`` header among Kafka ``headers`` (a sequence
    of ``(name, value)`` pairs as aiokafka gives them, or a mapping)."""
    if not headers:
        return None
    items: Iterable[tuple[Any, Any]] = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in items:
        if name == TRACEPARENT_HEADER:
            return parse_traceparent(value)
    return None


def trace_id_of(headers: Any) -> str:
    """The trace id of the ``traceparent`` among ``headers``, or a new one."""
    parent = traceparent_of(headers)
    return parent.trace_id if parent is not None else new_trace_id()


def tracer_from(settings: Settings, *, service: str) -> Tracer:
    """The tracer ``settings.observability.otel_exporter`` asks for; OpenTelemetry is imported
    only when an exporter is configured."""
    if not settings.observability.otel_exporter:
        return Tracer()
    from telemetry.otel import otel_tracer  # noqa: PLC0415 - no OpenTelemetry cost when off

    return otel_tracer(
        settings.observability.otel_exporter,
        endpoint=settings.observability.otel_endpoint,
        service=service,
    )


__all__ = [
    "AttributeValue",
    "TraceParent",
    "Tracer",
    "format_traceparent",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "trace_id_of",
    "traceparent_of",
    "tracer_from",
]
