"""B1/B2 helper process: a raw aiokafka relay (getmany → send_batch, no work), one hop.

``python -m bench.relay SRC DST GROUP`` runs until SIGTERM. Its clients come from the same
factories as the pipeline's (runtime/clients.py: acks=all, idempotent producer, the same
linger and fetch wait, read_committed), so the baseline and the stages differ only in what
runs between poll and send; offsets are committed after the batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from config.settings import Settings
from runtime.clients import kafka_consumer, kafka_producer

BATCH = 2000  # records per poll: the raw relay's best case


async def relay(src: str, dst: str, group: str) -> None:
    settings = Settings()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    consumer = kafka_consumer(settings, src, group=group, max_poll_records=BATCH)
    producer = kafka_producer(settings)
    await consumer.start()
    await producer.start()
    try:
        while not stopping.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=BATCH)
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
