"""Publishing the output of many consumed records, each isolated from the others.

A record whose output the producer refuses (too large, not serializable) or the broker refuses
(a non-retriable error on its acknowledgement) is switched to its next answer: first its dead
letter with its own outcome kept (without ``result``), then with a generic typed outcome, then
nothing (logged). A broker that is away (retriable errors, timeouts) is waited out on the
backoff ladder; a stop requested meanwhile raises :class:`runtime.retry.Stopped`. Each record's
reply copies (runtime/replies.py) are sent with it, best-effort.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from runtime.emit import Emit
from runtime.replies import Reply, ReplySender
from runtime.retry import backoff, pause
from runtime.turns import turn
from schemas.names import Topic

log = logging.getLogger("ratifier.runtime")

# Records handed to the producer (≈ 10 to 20 µs each) before the event loop is given to
# other batches (a consumer loop with independent partitions: a large batch never holds it
# for long, and a slice of ≈ 0.5 ms costs one turn of the loop, not one per few records).
YIELD_EVERY = 25

# Hands one record to the producer with the given `traceparent`; returns its acknowledgement.
Send = Callable[[Emit, bytes | None], Awaitable[Awaitable[Any]]]
# Hands many items' records to the producer at once, in one batch per topic-partition: per
# item (in order), the acknowledgements of the batches that hold its records, or None for an
# item it did not take whole (that item is sent alone). Never raises for one record's fault.
SendMany = Callable[
    [Sequence[tuple[tuple[Emit, ...], bytes | None]]],
    Awaitable[list[list[Awaitable[Any]] | None]],
]
# A refused record's answer after its n-th refusal (1: dead letter and its outcome kept, 2:
# a generic typed outcome), given why.
Answer = Callable[[int, str], tuple[Emit, ...]]


def is_transient(exc: BaseException) -> bool:
    """Whether a publish error is the broker's (wait and retry) rather than the record's."""
    if isinstance(exc, KafkaTimeoutError | KafkaConnectionError):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


def without_dead_letter(emits: tuple[Emit, ...]) -> tuple[Emit, ...]:
    return tuple(e for e in emits if e.topic is not Topic.DEADLETTER)


@dataclass
class Publication:
    """One consumed record's output in flight."""

    emits: tuple[Emit, ...]
    traceparent: bytes | None
    answer: Answer | None  # None: no other answer can be given
    refusals: int = 0
    futures: list[Awaitable[Any]] = field(default_factory=list)
    # Sent in batches shared with other records: a batch refused or lost as a whole is not
    # this record's refusal (another record of the batch may be the cause).
    batched: bool = False
    replies: list[tuple[Reply, Awaitable[Any]]] = field(default_factory=list)


class IsolatedPublisher:
    """``beat``, when given, is called at every wait for the broker: a service waiting out a
    broker outage is alive (its liveness probe must not restart it), not stuck."""

    def __init__(
        self,
        send: Send,
        *,
        what: str,
        stop: asyncio.Event | None = None,
        beat: Callable[[], object] | None = None,
        replies: ReplySender | None = None,
        send_many: SendMany | None = None,
    ) -> None:
        self._send_one = send
        self._send_many = send_many
        self._what = what
        self._stop = stop
        self._beat = beat
        self.replies = replies

    async def _wait(self, attempt: int) -> None:
        if self._beat is not None:
            self._beat()
        await pause(backoff(attempt), self._stop)

    def refused(self, item: Publication, exc: BaseException) -> None:
        item.refusals += 1
        if item.refusals > 2 or item.answer is None:
            log.error("%s: every answer of a record was refused: %r", self._what, exc)
            item.emits = ()
            return
        log.warning("%s: output refused (%r); dead-lettering its record", self._what, exc)
        emits = item.answer(item.refusals, f"output refused: {type(exc).__name__}")
        # The second time, the dead letter went out already with the first answer.
        item.emits = emits if item.refusals == 1 else without_dead_letter(emits)

    async def send(self, item: Publication) -> None:
        """Hand ``item``'s records to the producer (not waiting for acknowledgements)."""
        attempt = 0
        while True:
            item.futures = []
            try:
                for emit in item.emits:
                    item.futures.append(await self._send_one(emit, item.traceparent))
            except Exception as exc:  # noqa: BLE001 - the record's refusal or the broker's
                if not is_transient(exc):
                    self.refused(item, exc)
                    continue
                log.warning("%s: broker unavailable (%s); retrying", self._what, exc)
                await self._wait(attempt)
                attempt += 1
            else:
                if self.replies is not None:
                    item.replies = await self.replies.send(item.emits, item.traceparent)
                return

    async def publish_all(self, items: Sequence[Publication]) -> None:
        """Send every item, then wait for the acknowledgements of all of them; an item the
        broker refused is sent again as its next answer, one the broker lost is resent. With
        ``send_many``, the items go out in a few batches (one await and one acknowledgement per
        batch, not per record); an item of a batch refused or lost as a whole is then sent
        again alone, so that only its own refusal counts against it."""
        if self._send_many is not None:
            await self._send_batched(items)
        else:
            for n, item in enumerate(items, 1):
                await self.send(item)
                if n % YIELD_EVERY == 0:
                    await turn()  # other batches of the loop run meanwhile
        pending = {f for item in items for f in item.futures if isinstance(f, asyncio.Future)}
        if pending:
            await asyncio.wait(pending)  # one wait for the whole publication
        alone = [i for i in items if i.batched and not _acknowledged(i.futures)]
        if alone:
            log.info("%s: %d records' batches not acknowledged; sent alone", self._what, len(alone))
        for item in alone:
            item.batched = False
            await self.send(item)
        for item in items:
            attempt = 0
            while not _acknowledged(item.futures):
                acks = await asyncio.gather(*item.futures, return_exceptions=True)
                errors = [a for a in acks if isinstance(a, BaseException)]
                if not errors:
                    break
                refused = next((e for e in errors if not is_transient(e)), None)
                if refused is not None:
                    self.refused(item, refused)
                else:
                    log.warning("%s: broker unavailable (%s); resending", self._what, errors[0])
                    await self._wait(attempt)
                    attempt += 1
                await self.send(item)
        if self.replies is not None:
            await self.replies.settle([reply for item in items for reply in item.replies])

    async def _send_batched(self, items: Sequence[Publication]) -> None:
        """Hand ``items`` to ``send_many``; an item it did not take is sent alone (one whose
        records went into two batches, one of which could not be handed over, may then be
        published twice: at least once, as for a resend)."""
        assert self._send_many is not None
        try:
            acks = await self._send_many([(item.emits, item.traceparent) for item in items])
        except Exception as exc:  # noqa: BLE001 - then every item goes alone, as without it
            log.warning("%s: batched send failed (%r); records go alone", self._what, exc)
            acks = [None] * len(items)
        for n, (item, taken) in enumerate(zip(items, acks, strict=True), 1):
            if taken is not None:
                item.futures = list(taken)
                item.batched = True
                if self.replies is not None:
                    item.replies = await self.replies.send(item.emits, item.traceparent)
            else:
                await self.send(item)
            if n % YIELD_EVERY == 0:
                await turn()


def _acknowledged(futures: Sequence[Awaitable[Any]]) -> bool:
    """Whether every one of ``futures`` is a future already acknowledged without error."""
    return all(
        isinstance(f, asyncio.Future) and f.done() and not f.cancelled() and f.exception() is None
        for f in futures
    )
