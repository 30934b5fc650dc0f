"""One tenant's flood of reads as an OS process of its own (tests/e2e/test_admission.py), as
another tenant's agents would send it: not in the process that sends tenant B's calls and
watches the outcomes, whose event loop it would otherwise hold while it publishes.

    python -m testsupport.flood TOPIC TOKEN RUN_ID COUNT OUT

It prints ``ready`` once its producer is connected, publishes COUNT reads (call ids
``flood-<RUN_ID>-a-<n>``, keyed by the tenant's lanes) when a line arrives on stdin, and then
writes OUT: each call id's publication time (``time.monotonic()``, one clock for every process
of the machine)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

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


async def flood(topic: str, token: str, run_id: str, count: int) -> dict[str, float]:
    producer = kafka_producer(Settings(), linger_ms=5)
    await producer.start()
    try:
        ids = [f"flood-{run_id}-a-{i}" for i in range(count)]
        records = [
            (proposal_key(token, call_id=c).encode(), read_proposal(c, "tenant-a", token))
            for c in ids
        ]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        sent: dict[str, float] = {}
        for call_id, (key, value) in zip(ids, records, strict=True):
            sent[call_id] = time.monotonic()
            await producer.send(topic, key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def main() -> int:
    topic, token, run_id, count, out = sys.argv[1:6]
    sent = asyncio.run(flood(topic, token, run_id, int(count)))
    Path(out).write_text(json.dumps(sent), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
