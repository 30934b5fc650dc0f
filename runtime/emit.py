"""What a handler decides to publish: pure values, sent by the runtime at the edge."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.envelopes import Record
from schemas.names import Topic


@dataclass(frozen=True, kw_only=True)
class Emit:
    topic: Topic
    key: str | None
    value: Record
