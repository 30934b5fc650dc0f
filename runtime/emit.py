"""What a handler decides to publish: pure values, sent by the runtime at the edge."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from schemas.envelopes import DeadLetter, Record, SourcePosition
from schemas.names import Topic


@dataclass(frozen=True, kw_only=True)
class Emit:
    topic: Topic
    key: str | None
    value: Record


def dead_letter(
    raw: bytes | None,
    *,
    reason: str,
    call_id: str | None,
    source: SourcePosition,
    at: datetime,
    key: str | None = None,
    keep_prefix: bool = True,
) -> Emit:
    """The one dead letter of every stage: the raw bytes' digest, size and a bounded prefix
    (``keep_prefix=False``: none), keyed like its source record (or by the call id recovered
    from it)."""
    return Emit(
        topic=Topic.DEADLETTER,
        key=key if key is not None else call_id,
        value=DeadLetter.of_raw(
            raw, reason=reason, call_id=call_id, source=source, at=at, keep_prefix=keep_prefix
        ),
    )
