"""Reply routing (v1.3): a copy of each outcome, and of each approval request, of a call that
names a reply address goes to that address too, so that an agent process reads its own replies
and not the whole `outcomes` topic. The originals are published as before (dashboards, audit).

``reply_copies`` is the one pure decision, used by every publish path (the runtime loop, the
stream stages' publisher, the reconciler); ``ReplySender`` sends its copies best-effort:
a reply copy never holds up or refuses the records it copies. A reply topic the broker does not
take within ``replies.send_timeout_seconds`` (missing, or a partition it does not have) is
skipped, and then left alone for ``replies.skip_seconds``; its agent still finds the outcome on
`outcomes`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from runtime.emit import Emit
from schemas.envelopes import ApprovalRequest, Outcome, Record, ReplyAddress
from schemas.names import REPLY_OF_HEADER, TRACEPARENT_HEADER, Topic

log = logging.getLogger("ratifier.runtime")

# The records that are copied to their call's reply address.
REPLIED_TOPICS: frozenset[Topic] = frozenset({Topic.OUTCOMES, Topic.APPROVALS_REQUESTED})


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One reply copy: ``value`` (published to ``of``) for the topic and partition of a reply
    address, keyed by call id."""

    topic: str
    partition: int | None
    key: str
    value: Record
    of: Topic


def reply_address(value: Record) -> ReplyAddress | None:
    if isinstance(value, Outcome | ApprovalRequest):
        return value.reply_to
    return None


def reply_copies(emits: Iterable[Emit], namespace: str) -> tuple[Reply, ...]:
    """The reply copies ``emits`` owe: one per outcome or approval request whose call names a
    reply address under ``namespace`` (any other address was refused by the validator; one
    that reaches here anyway is not honoured)."""
    copies = []
    for emit in emits:
        if emit.topic not in REPLIED_TOPICS:
            continue
        address = reply_address(emit.value)
        if address is None or not address.under(namespace):
            continue
        key = getattr(emit.value, "call_id", None) or emit.key or ""
        copies.append(
            Reply(
                topic=address.topic,
                partition=address.partition,
                key=key,
                value=emit.value,
                of=emit.topic,
            )
        )
    return tuple(copies)


# Hands one reply copy to the producer with the given `traceparent`; returns its ack.
SendReply = Callable[[Reply, bytes | None], Awaitable[Awaitable[Any]]]


def reply_headers(reply: Reply, traceparent: bytes | None) -> list[tuple[str, bytes]]:
    headers = [(REPLY_OF_HEADER, reply.of.value.encode())]
    if traceparent:
        headers.append((TRACEPARENT_HEADER, traceparent))
    return headers


async def send_reply(
    producer: AIOKafkaProducer, reply: Reply, traceparent: bytes | None
) -> Awaitable[Any]:
    """`SendReply` for an aiokafka producer."""
    ack: Awaitable[Any] = await producer.send(
        reply.topic,
        key=reply.key.encode(),
        value=reply.value.to_bytes(),
        partition=reply.partition,
        headers=reply_headers(reply, traceparent),
    )
    return ack


class ReplySender:
    """Sends reply copies best-effort (see the module's docstring)."""

    def __init__(
        self,
        send: SendReply,
        *,
        namespace: str,
        timeout: float = 2.0,
        skip_for: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self.namespace = namespace
        self._timeout = timeout
        self._skip_for = skip_for
        self._clock = clock
        self._skipped_until: dict[str, float] = {}
        self.sent = 0
        self.failed = 0

    def _failed(self, reply: Reply, exc: BaseException | str) -> None:
        self.failed += 1
        self._skipped_until[reply.topic] = self._clock() + self._skip_for
        log.warning(
            "reply copy of %s to %s skipped (%r); it is on %s regardless",
            reply.key,
            reply.topic,
            exc,
            reply.of.value,
        )

    async def send(
        self, emits: Iterable[Emit], traceparent: bytes | None
    ) -> list[tuple[Reply, Awaitable[Any]]]:
        """Hand the reply copies ``emits`` owe to the producer; their acknowledgements."""
        acks: list[tuple[Reply, Awaitable[Any]]] = []
        for reply in reply_copies(emits, self.namespace):
            if self._skipped_until.get(reply.topic, 0.0) > self._clock():
                continue
            try:
                ack = await asyncio.wait_for(self._send(reply, traceparent), self._timeout)
            except Exception as exc:  # noqa: BLE001 - a reply copy never fails its record
                self._failed(reply, exc)
                continue
            # A publisher that does not settle its copies must not leave a refused one's
            # error unread.
            ack = asyncio.ensure_future(ack)
            ack.add_done_callback(_read_outcome)
            acks.append((reply, ack))
        return acks

    async def settle(self, acks: Sequence[tuple[Reply, Awaitable[Any]]]) -> None:
        """Wait (bounded) for the acknowledgements of reply copies; count and log failures."""
        if not acks:
            return
        futures = [asyncio.ensure_future(ack) for _reply, ack in acks]
        _done, pending = await asyncio.wait(futures, timeout=self._timeout)
        for (reply, _ack), future in zip(acks, futures, strict=True):
            if future in pending:
                # Not cancelled: the producer completes it (its late error is read, not raised).
                self._failed(reply, "no acknowledgement in time")
            elif future.cancelled() or future.exception() is not None:
                self._failed(reply, "refused" if future.cancelled() else future.exception() or "")
            else:
                self.sent += 1


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
