"""B1/B2 helper process: a raw aiokafka relay (getmany → send_batch, no work), one hop.

``python -m bench.relay SRC DST GROUP`` runs until SIGTERM. Same producer safety as the
pipeline: acks=all, idempotent producer, offsets committed after the batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.settings import Settings


async def relay(src: str, dst: str, group: str) -> None:
    settings = Settings()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=2000,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=3,
    )
    await consumer.start()
    await producer.start()
    try:
        while not stopping.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=2000)
            sent = []
            for tp, records in batches.items():
                batch = producer.create_batch()
                for r in records:
                    if batch.append(key=r.key, value=r.value, timestamp=None) is None:
                        sent.append(await producer.send_batch(batch, dst, partition=tp.partition))
                        batch = producer.create_batch()
                        batch.append(key=r.key, value=r.value, timestamp=None)
                sent.append(await producer.send_batch(batch, dst, partition=tp.partition))
            if sent:
                await asyncio.gather(*sent)
                await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    asyncio.run(relay(*sys.argv[1:4]))
