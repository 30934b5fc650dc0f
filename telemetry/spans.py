"""The span types every tracer shares: the W3C parent, attribute values and the tracer that
only makes span ids. Kept apart from `telemetry.tracing` so that the OpenTelemetry tracer
(`telemetry.otel`) builds on them without importing the module that chooses it."""

from __future__ import annotations

import random  # span ids need uniqueness, not secrecy; os.urandom is slow
from collections.abc import Mapping
from dataclasses import dataclass

AttributeValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero
    sampled: bool = True


def new_span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


class Tracer:
    """Records one span per stage per record. Without an exporter it only makes span ids."""

    enabled = False

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
        """Record a finished span of ``stage`` in ``trace_id``; return its span id (the
        parent of the next hop)."""
        return new_span_id()

    def shutdown(self) -> None:
        return None
