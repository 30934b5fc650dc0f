"""B1/B2/B2r helper process: a raw aiokafka relay (getmany → send_batch), one hop.

``python -m bench.relay SRC DST GROUP [WORK]`` runs until SIGTERM. Its clients come from the
same factories as the pipeline's (runtime/clients.py: acks=all, idempotent producer, the same
linger and fetch wait, read_committed) and its consumer gets the pipeline's fetch pacing
(``prompt_fetches``, as every consumer loop of the pipeline), so the baseline and the stages
differ only in what runs between poll and send; offsets are committed after the batch is
acknowledged. ``WORK`` is what the hop does per batch before it relays it (B2r's last hop):

- ``get:<url>``: one HTTP GET per record to the fake provider (``<url>/refunds?
  idempotency_key=…``, answered 404), all of a batch's at once on one kept-alive session:
  the hop issue 46 defines;
- ``pg``: what the executor does for a batch of reads (executors/reads.py): each record's
  JSON parsed, one query for the batch's payments, one statement for its rows (the audit
  rows' stand-in), one commit, in the benchmark's database.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import psycopg

from commands.sql import named_query
from config.settings import Settings
from runtime.clients import kafka_consumer, kafka_producer, prompt_fetches

BATCH = 2000  # records per poll: the raw relay's best case

Work = Callable[[Sequence[Any]], Awaitable[None]]


async def relay(src: str, dst: str, group: str, work: str = "") -> None:
    settings = Settings()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    consumer = kafka_consumer(settings, src, group=group, max_poll_records=BATCH)
    producer = kafka_producer(settings)
    await consumer.start()
    await producer.start()
    prompt_fetches(consumer)
    session: aiohttp.ClientSession | None = None
    conn: psycopg.AsyncConnection[Any] | None = None
    do: Work | None = None
    if work.startswith("get:"):
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        do = _gets(session, work.removeprefix("get:"))
    elif work == "pg":
        conn = await psycopg.AsyncConnection.connect(settings.storage.database_url)
        await conn.execute(named_query("bench", "relay_reads_table"))
        await conn.commit()
        do = _reads(conn)
    elif work:
        raise SystemExit(f"unknown work {work!r}: get:<url> or pg")
    try:
        while not stopping.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=BATCH)
            if do is not None and batches:
                await do([r for records in batches.values() for r in records])
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
        if session is not None:
            await session.close()
        if conn is not None:
            await conn.close()


def _gets(session: aiohttp.ClientSession, url: str) -> Work:
    async def one(key: bytes | None) -> None:
        params = {"idempotency_key": (key or b"none").decode(errors="replace")[:200]}
        async with session.get(f"{url}/refunds", params=params) as response:
            await response.read()

    async def work(records: Sequence[Any]) -> None:
        await asyncio.gather(*(one(r.key) for r in records))

    return work


def _reads(conn: psycopg.AsyncConnection[Any]) -> Work:
    async def work(records: Sequence[Any]) -> None:
        keys, payments = [], []
        for r in records:
            try:
                body = json.loads(r.value or b"")
                payment = str(body.get("arguments", {}).get("payment_id", ""))
            except (ValueError, AttributeError):
                payment = ""
            keys.append((r.key or b"").decode(errors="replace"))
            payments.append(payment)
        async with conn.cursor() as cur:
            await cur.execute(
                named_query("bench", "relay_read_payments"),
                {"tenant": "tenant-a", "payment_ids": sorted(set(payments))},
            )
            await cur.fetchall()
            await cur.execute(
                named_query("bench", "relay_read_audit"),
                {"call_keys": keys, "payment_ids": payments},
            )
        await conn.commit()

    return work


if __name__ == "__main__":
    asyncio.run(relay(*sys.argv[1:5]))
