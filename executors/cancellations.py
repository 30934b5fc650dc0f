"""The calls withdrawn by the agent runtime (`calls.cancelled`), as every executor sees
them: all partitions, followed from the beginning (no consumer group)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from pydantic import ValidationError

from config.settings import Settings
from runtime.reader import TopicReader
from schemas.envelopes import CancelRequest
from schemas.names import Topic

log = logging.getLogger("ratifier.executor")
REMEMBERED = 1_000_000  # most recent cancellations kept; older calls have long executed


class CancelledCalls:
    """A bounded set of cancelled call ids (`in` checks it)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids

    def add(self, call_id: str) -> None:
        self._ids[call_id] = None
        while len(self._ids) > REMEMBERED:
            self._ids.popitem(last=False)

    def apply(self, raw: bytes | None) -> None:
        try:
            self.add(CancelRequest.model_validate_json(raw or b"").call_id)
        except ValidationError:
            log.warning("ignoring an unreadable calls.cancelled record")

    async def follow(self, ready: asyncio.Event | None = None) -> None:
        """Read the topic from the beginning (then set ``ready``) and follow it."""
        reader = TopicReader(self._settings, [Topic.CANCELLED], lambda _t, raw: self.apply(raw))
        await reader.follow(ready)
