"""One tenant's flood of reads as an OS process of its own (tests/e2e/test_admission.py), as
another tenant's agents would send it: not in the process that sends tenant B's calls and
watches the outcomes, whose event loop it would otherwise hold while it publishes.

    python -m testsupport.flood TOPIC TOKEN RUN_ID COUNT SECONDS OUT

It prints ``ready`` once its producer is connected; when a line arrives on stdin, it
publishes COUNT reads (call ids ``flood-<RUN_ID>-a-<n>``, keyed by the tenant's lanes) evenly
over SECONDS (0: as fast as the broker takes them) and prints ``published`` once all are
acknowledged. When a second line arrives, it writes OUT: each call id's publication time
(``time.monotonic()``, one clock for every process of the machine), and exits. Its stopping
(the producer's, the interpreter's, ≈ 0.2 s of CPU) thus waits until the test has its
outcomes: it does not take CPU from the pipeline while the flood's last calls are handled."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from config.settings import Settings
from runtime.clients import kafka_producer
from schemas.lanes import proposal_key


def read_proposal(call_id: str, tenant: str, token: str) -> bytes:
    """A `calls.proposed` record of ``get_payment`` for one of the reference tenants."""
    payment = "pay_A1001" if tenant == "tenant-a" else "pay_B2001"
    return json.dumps(
        {
            "v": 1,
            "call_id": call_id,
            "tool": "get_payment",
            "arguments": {"payment_id": payment},
            "context": token,
            "proposed_at": "2026-12-02T00:00:00+00:00",
        },
        separators=(",", ":"),
    ).encode()


# Records per produce request at most: as large as the stages' own batches
# (streams/stateless.py), so that the load generator, which shares the machine with the
# pipeline it measures, spends little CPU per record.
FLOOD_BATCH_BYTES = 256 * 1024
# A paced flood publishes what is due every this often.
SLICE_SECONDS = 0.02


async def flood(
    topic: str, token: str, run_id: str, count: int, seconds: float
) -> dict[str, float]:
    """Publish ``count`` reads evenly over ``seconds`` (0: as fast as the broker takes them);
    each call id's publication time."""
    producer = kafka_producer(Settings(), linger_ms=5, max_batch_size=FLOOD_BATCH_BYTES)
    await producer.start()
    try:
        ids = [f"flood-{run_id}-a-{i}" for i in range(count)]
        every = sorted(await producer.partitions_for(topic))
        records = []
        for c in ids:
            key = proposal_key(token, call_id=c).encode()
            partition = producer._partitioner(key, every, every)
            records.append((c, partition, key, read_proposal(c, "tenant-a", token)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        sent: dict[str, float] = {}
        acks: list[Any] = []
        # Each partition's records in batches built here and handed over whole (what the
        # producer's send() does record by record, at a fraction of the CPU), a slice of
        # them every SLICE_SECONDS when paced.
        slices = max(1, int(seconds / SLICE_SECONDS)) if seconds > 0 else 1
        start = time.monotonic()
        for n in range(slices):
            due = start + n * SLICE_SECONDS
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            building: dict[int, Any] = {}
            for call_id, partition, key, value in records[
                n * count // slices : (n + 1) * count // slices
            ]:
                sent[call_id] = time.monotonic()
                batch = building.get(partition)
                if batch is None:
                    batch = building[partition] = producer.create_batch()
                if batch.append(timestamp=None, key=key, value=value, headers=[]) is None:
                    acks.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = building[partition] = producer.create_batch()
                    batch.append(timestamp=None, key=key, value=value, headers=[])
            for partition, batch in building.items():
                acks.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*acks)
        print("published", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    finally:
        await producer.stop()
    return sent


def main() -> int:
    topic, token, run_id, count, seconds, out = sys.argv[1:7]
    sent = asyncio.run(flood(topic, token, run_id, int(count), float(seconds)))
    Path(out).write_text(json.dumps(sent), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
