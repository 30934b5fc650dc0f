"""Metrics and the trace hop of one record through a stream stage.

A stage's metric status is the status of the outcome it published, or what it did with the
record otherwise (forwarded, committed, deadletter, ignored). Its span's trace is the one
the record itself carries (`trace_id` of the published records), else the incoming
`traceparent`'s, else a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.envelopes import Outcome
from schemas.names import Topic
from streams.emit import Emit
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


class StageObserver:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def finished(
        self,
        stage: str,
        emits: Sequence[Emit],
        *,
        parent: TraceParent | None,
        start_ns: int,
        end_ns: int,
        trace_id: str | None = None,
    ) -> bytes:
        """Count the record, record its span; return the `traceparent` for what it emits."""
        status, code = status_of(emits)
        observe_record(stage, status=status, code=code, seconds=(end_ns - start_ns) / 1e9)
        trace_id = (
            trace_id
            or trace_id_in(emits)
            or (parent.trace_id if parent is not None else new_trace_id())
        )
        attributes: dict[str, str | None] = {}
        if self.tracer.enabled:
            first = emits[0].value if emits else None
            attributes = {
                "ratifier.stage": stage,
                "ratifier.status": status,
                "ratifier.error_code": code,
                "ratifier.call_id": getattr(first, "call_id", None),
                "ratifier.tool": getattr(first, "tool", None),
            }
        span_id = self.tracer.record(
            stage=stage,
            trace_id=trace_id,
            parent=parent,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes=attributes,
        )
        return format_traceparent(trace_id, span_id)
