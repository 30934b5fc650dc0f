"""Publishing a stream stage's records, one consumed record isolated from the others.

A record whose output the producer refuses (too large, not serializable) or the broker
refuses is answered instead by a bounded dead letter and, when its call id can be read, a
typed outcome (:func:`runtime.loop.failed`); the other records of its batch are published
as decided. A broker that is away is waited out with the runtime's backoff ladder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust

from runtime.emit import Emit
from runtime.loop import call_id_in, failed, is_transient, text_key, without_dead_letter
from runtime.retry import backoff
from schemas.envelopes import Outcome, SourcePosition, Stage
from schemas.names import TRACEPARENT_HEADER, Topic

log = logging.getLogger("ratifier.streams")


def position(event: Any) -> SourcePosition:
    message = event.message
    return SourcePosition(topic=message.topic, partition=message.partition, offset=message.offset)


@dataclass
class Publication:
    """One consumed record's output in flight."""

    event: Any
    stage: Stage
    emits: tuple[Emit, ...]
    traceparent: bytes | None
    futures: list[Awaitable[Any]] = field(default_factory=list)
    refusals: int = 0  # answers refused so far: 1 = dead-lettered, 2 = generic, 3 = none


class StagePublisher:
    def __init__(self, topics: dict[Topic, Any]) -> None:
        self._topics = topics

    def _refused(self, item: Publication, exc: BaseException) -> None:
        """Switch ``item`` to its next answer: its dead letter with its outcome kept, then with
        a generic typed outcome, then nothing."""
        item.refusals += 1
        if item.refusals > 2 or item.event is None:
            log.error("%s: every answer of a record refused: %r", item.stage, exc)
            item.emits = ()
            return
        log.warning("%s: output refused (%r); dead-lettering its record", item.stage, exc)
        event = item.event
        replaces = (
            next((e.value for e in item.emits if isinstance(e.value, Outcome)), None)
            if item.refusals == 1
            else None
        )
        emits = failed(
            event.value,
            reason=f"{item.stage.value}: output refused: {type(exc).__name__}",
            source=position(event),
            stage=item.stage,
            key=text_key(event.key),
            call_id=call_id_in(event.value),
            replaces=replaces,
        )
        # The second time, the dead letter went out already with the first answer.
        item.emits = emits if item.refusals == 1 else without_dead_letter(emits)

    async def _send(self, item: Publication) -> None:
        headers = {TRACEPARENT_HEADER: item.traceparent} if item.traceparent else None
        attempt = 0
        while True:
            item.futures = []
            try:
                for emit in item.emits:
                    item.futures.append(
                        await self._topics[emit.topic].send(
                            key=emit.key.encode() if emit.key is not None else None,
                            value=emit.value.to_bytes(),
                            headers=headers,
                        )
                    )
                return
            except Exception as exc:  # noqa: BLE001 - the record's refusal or the broker's
                if not is_transient(exc):
                    self._refused(item, exc)
                    continue
                log.warning("%s: broker unavailable (%s); retrying", item.stage, exc)
                await asyncio.sleep(backoff(attempt))
                attempt += 1

    async def publish_all(self, items: Sequence[Publication]) -> None:
        """Send every item, then wait for the broker's acknowledgements of all of them; an
        item the broker refused is answered by its fallback."""
        for item in items:
            await self._send(item)
        for item in items:
            attempt = 0
            while True:
                acks = await asyncio.gather(*item.futures, return_exceptions=True)
                errors = [a for a in acks if isinstance(a, BaseException)]
                if not errors:
                    break
                refused = next((e for e in errors if not is_transient(e)), None)
                if refused is not None:
                    self._refused(item, refused)
                else:
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
                await self._send(item)

    async def publish(
        self, emits: tuple[Emit, ...], traceparent: bytes | None, stage: Stage = Stage.APPROVE
    ) -> None:
        """Publish the output of the record being processed (faust's current event), isolated
        from the others: what the producer refuses is answered by its fallback. (Records are
        sent, not awaited one by one: the broker's acknowledgements come with faust's
        commit.)"""
        await self._send(Publication(faust.current_event(), stage, emits, traceparent))
