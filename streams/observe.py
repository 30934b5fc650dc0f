"""Metrics and the trace hop of one record through a stream stage: the runtime's hop
(runtime/hop.py), with the stage's status, call and trace read from what it publishes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.emit import Emit
from runtime.hop import record_emits_hop, status_of, trace_id_in
from telemetry.tracing import Tracer

__all__ = ["StageObserver", "status_of", "trace_id_in"]


class StageObserver:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def finished(self, stage: str, emits: Sequence[Emit], **hop: Any) -> bytes:
        """Count the record, record its span; return the `traceparent` for what it emits
        (``hop``: ``parent``, ``start_ns``, ``end_ns``, optionally ``trace_id``)."""
        return record_emits_hop(self.tracer, stage, emits, **hop)
