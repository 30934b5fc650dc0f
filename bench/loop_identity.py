"""T1 helper process: a stateless stage hop as the validator and authorizer now run it — the
runtime's :class:`runtime.loop.ConsumerLoop` (same clients, batch size, poll, publish with
isolation, acknowledgements and commit as ``streams/stateless.py``) — with a handler that
does no work: each consumed record is published unchanged.

``python -m bench.loop_identity SRC DST GROUP [lanes]`` (SRC and DST are pipeline topic names
without the run's prefix, e.g. ``calls.proposed``) runs until SIGTERM. With ``lanes``, the loop
schedules records in the stages' tenant lanes (``LaneLoop`` with ``tenant_lane`` and the
validator's lane size), as the stages run now; without, one batch at a time: the difference is
the scheduling's cost per record (issue 45).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from config.settings import Settings
from runtime.clients import kafka_consumer, kafka_producer
from runtime.emit import Emit
from runtime.loop import BatchHandler, Consumed, Handled, consumer_loop, text_key
from schemas.envelopes import Record
from schemas.names import Topic
from schemas.vocabulary import StreamStage
from streams.stateless import BATCH_MAX, PARTITION_BATCH, tenant_lane
from telemetry.tracing import tracer_from

# As streams/stateless.py configures its loops (kept in step by hand: the loop's own
# defaults would measure another shape).
POLL_MS = 100


@dataclass(frozen=True)
class RawRecord:
    """A consumed value published as it came (the loop publishes ``value.to_bytes()``)."""

    raw: bytes

    def to_bytes(self) -> bytes:
        return self.raw


def identity(target: Topic) -> BatchHandler:
    async def handle(records: Sequence[Consumed]) -> list[Handled]:
        return [
            Handled(
                emits=(
                    Emit(
                        topic=target,
                        key=text_key(r.key),
                        value=cast(Record, RawRecord(r.value or b"")),
                    ),
                )
            )
            for r in records
        ]

    return handle


async def run(source: Topic, target: Topic, group: str, lanes: bool = False) -> None:
    settings = Settings()
    consumer = kafka_consumer(
        settings, settings.topic(source), group=group, max_poll_records=BATCH_MAX
    )
    producer = kafka_producer(settings)
    loop = consumer_loop(
        settings,
        consumer,
        producer,
        stage="identity",
        group=group,
        handle=identity(target),
        tracer=tracer_from(settings, service="bench-identity"),  # as the stages' (off unless set)
        max_records=BATCH_MAX,
        poll_ms=POLL_MS,
        lane=tenant_lane if lanes else None,
        lane_records=PARTITION_BATCH[StreamStage.VALIDATOR] if lanes else None,
    )
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, loop.stop)
    await producer.start()
    await consumer.start()
    try:
        await loop.run()
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    asyncio.run(
        run(Topic(sys.argv[1]), Topic(sys.argv[2]), sys.argv[3], sys.argv[4:5] == ["lanes"])
    )
