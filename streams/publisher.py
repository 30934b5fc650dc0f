"""Publishing a stream stage's records, one consumed record isolated from the others
(runtime/publish.py): a record whose output the producer or the broker refuses is answered
instead by a bounded dead letter and, when its call id can be read, a typed outcome; the
other records of its batch are published as decided. Reply copies (runtime/replies.py) go out
with their records, through a producer of their own: sharing faust's producer, a record to a
new reply topic left the acknowledgement of the stage's own records pending (seen in the e2e
test), and a reply topic must never hold up the pipeline's records."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import faust
from aiokafka import AIOKafkaProducer

from config.settings import Settings
from runtime.clients import kafka_producer, start_kafka_client
from runtime.emit import Emit
from runtime.loop import call_id_in, failed, reply_to_in, text_key
from runtime.publish import Answer, IsolatedPublisher, Publication
from runtime.replies import Reply, ReplySender, send_reply
from schemas.envelopes import Outcome, SourcePosition, Stage
from schemas.names import TRACEPARENT_HEADER, Topic


def position(event: Any) -> SourcePosition:
    message = event.message
    return SourcePosition(topic=message.topic, partition=message.partition, offset=message.offset)


def answer_for(event: Any, stage: Stage, emits: tuple[Emit, ...]) -> Answer | None:
    """The answers of ``event`` if its output ``emits`` is refused."""
    if event is None:
        return None

    def answer(refusals: int, reason: str) -> tuple[Emit, ...]:
        return failed(
            event.value,
            reason=f"{stage.value}: {reason}",
            source=position(event),
            stage=stage,
            key=text_key(event.key),
            call_id=call_id_in(event.value),
            replaces=next((e.value for e in emits if isinstance(e.value, Outcome)), None)
            if refusals == 1
            else None,
            reply_to=reply_to_in(event.value),
        )

    return answer


class ReplyProducer:
    """The stream stages' producer of reply copies, started on first use (a worker whose
    calls name no reply address never opens it)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._started: asyncio.Task[AIOKafkaProducer] | None = None

    async def _start(self) -> AIOKafkaProducer:
        producer = kafka_producer(self._settings)
        try:
            await start_kafka_client(producer, self._settings.kafka)
        except BaseException:
            await producer.stop()
            self._started = None  # tried again with the next reply copy
            raise
        return producer

    async def send(self, reply: Reply, traceparent: bytes | None) -> Awaitable[Any]:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        # A reply copy's bounded wait may give up; the start it waited for goes on.
        producer = await asyncio.shield(self._started)
        return await send_reply(producer, reply, traceparent)

    async def stop(self) -> None:
        if self._started is not None and self._started.done() and not self._started.exception():
            await self._started.result().stop()
        self._started = None


def stage_replies(settings: Settings) -> tuple[ReplySender, ReplyProducer]:
    """The reply copies of the stream stages and the producer that sends them."""
    producer = ReplyProducer(settings)
    sender = ReplySender(
        producer.send,
        namespace=settings.reply_namespace,
        timeout=settings.replies.send_timeout_seconds,
        skip_for=settings.replies.skip_seconds,
    )
    return sender, producer


class StagePublisher:
    def __init__(self, topics: dict[Topic, Any], *, replies: ReplySender | None = None) -> None:
        self._topics = topics
        self._publisher = IsolatedPublisher(self._send, what="streams", replies=replies)

    async def _send(self, emit: Emit, traceparent: bytes | None) -> Awaitable[Any]:
        future: Awaitable[Any] = await self._topics[emit.topic].send(
            key=emit.key.encode() if emit.key is not None else None,
            value=emit.value.to_bytes(),
            headers={TRACEPARENT_HEADER: traceparent} if traceparent else None,
        )
        return future

    async def publish_all(
        self, stage: Stage, outputs: Sequence[tuple[Any, tuple[Emit, ...], bytes | None]]
    ) -> None:
        """Publish each ``(event, emits, traceparent)`` and wait for the acknowledgements of
        all; a refused record is answered alone."""
        await self._publisher.publish_all(
            [
                Publication(emits, hop, answer_for(event, stage, emits))
                for event, emits, hop in outputs
            ]
        )

    async def publish(
        self, emits: tuple[Emit, ...], traceparent: bytes | None, stage: Stage = Stage.APPROVE
    ) -> None:
        """Publish the output of the record being processed (faust's current event), isolated
        from the others: what the producer refuses is answered by its fallback. (Records are
        sent, not awaited one by one: the broker's acknowledgements come with faust's
        commit.)"""
        event = faust.current_event()
        await self._publisher.send(Publication(emits, traceparent, answer_for(event, stage, emits)))
