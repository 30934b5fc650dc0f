"""A record's hop through a service, recorded one way everywhere: its metric, its span, and
the ``traceparent`` of what it publishes.

A hop's metric status is the status of the outcome it published, or what it did with the
record otherwise (forwarded, committed, deadletter, ignored). Its span's trace is the one the
published records carry (their ``trace_id``), else the incoming ``traceparent``'s, else a new
one.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.emit import Emit
from schemas.envelopes import Outcome
from schemas.names import Topic
from telemetry.metrics import observe_record
from telemetry.tracing import TraceParent, Tracer, format_traceparent, new_trace_id


def status_of(emits: Sequence[Emit]) -> tuple[str, str | None]:
    """The metric status and error code of a record that produced ``emits``."""
    for emit in emits:
        if isinstance(emit.value, Outcome):
            error = emit.value.error
            return emit.value.status.value, error.code.value if error is not None else None
    topics = {emit.topic for emit in emits}
    if Topic.DEADLETTER in topics:
        return "deadletter", None
    if Topic.COMMITTED in topics:
        return "committed", None
    return ("forwarded" if emits else "ignored"), None


def trace_id_in(emits: Sequence[Emit]) -> str | None:
    for emit in emits:
        trace_id = getattr(emit.value, "trace_id", None)
        if trace_id:
            return str(trace_id)
    return None


def record_hop(
    tracer: Tracer,
    stage: str,
    *,
    status: str,
    code: str | None,
    parent: TraceParent | None,
    start_ns: int,
    end_ns: int,
    trace_id: str | None = None,
    call_id: str | None = None,
    tool: str | None = None,
) -> bytes:
    """Count the record, record its span; return the `traceparent` for what it publishes."""
    observe_record(stage, status=status, code=code, seconds=(end_ns - start_ns) / 1e9)
    trace_id = trace_id or (parent.trace_id if parent is not None else new_trace_id())
    span_id = tracer.record(
        stage=stage,
        trace_id=trace_id,
        parent=parent,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes={
            "ratifier.stage": stage,
            "ratifier.status": status,
            "ratifier.error_code": code,
            "ratifier.call_id": call_id,
            "ratifier.tool": tool,
        }
        if tracer.enabled
        else {},
    )
    return format_traceparent(trace_id, span_id)


def record_emits_hop(
    tracer: Tracer,
    stage: str,
    emits: Sequence[Emit],
    *,
    parent: TraceParent | None,
    start_ns: int,
    end_ns: int,
    trace_id: str | None = None,
) -> bytes:
    """:func:`record_hop` for a record whose status, call and trace are those of ``emits``."""
    status, code = status_of(emits)
    first = emits[0].value if emits else None
    return record_hop(
        tracer,
        stage,
        status=status,
        code=code,
        parent=parent,
        start_ns=start_ns,
        end_ns=end_ns,
        trace_id=trace_id or trace_id_in(emits),
        call_id=getattr(first, "call_id", None),
        tool=getattr(first, "tool", None),
    )
