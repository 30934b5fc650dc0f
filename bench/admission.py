"""Admission's cost (issue 27): CPU per call of the validator's handler without admission,
with every call admitted, and with every call refused (`rate_limited`), on the reference
catalog with real Redis (one Lua round trip per batch of 500); CPU per refused record of the
validator's whole path but the fetch (handler, the loop's publication, the producers' sends
to real Kafka, in partition batches of 2,400 as a flood brings them, with the collector set
as `ratifier stages` sets it). The noisy neighbour is measured by `make bench` itself
(bench/flood.py); test-artifacts/admission-flood.json, which `make test-admission-flood` writes,
is read by nothing here: it may be any earlier run's.

`python -m bench.admission [N]` runs it alone and prints the figures.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import ConsumerRecord

from commands.catalog import load_catalog
from commands.limits import parse_limits
from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from commands.validate import Limits
from config.settings import Settings
from ratifier.topics import delete_topics, ensure_topics
from runtime.bulk import BulkRecords
from runtime.clients import kafka_producer, redis_client
from runtime.heap import YOUNG_OBJECTS
from runtime.identity import context_keys, issue_context_token
from runtime.loop import consumer_loop
from streams.admission import Admission
from streams.fair_share import FairShedder
from streams.limiter import FleetLimiter
from streams.stateless import PRODUCER_BATCH_BYTES, validator_handler

BATCH = 500
# A flood's partition batch: about what one fetch of `calls.proposed` brings.
FLOOD_BATCH = 2_400
# Written by tests/e2e/test_admission.py (`make test-admission-flood`); not read by the bench.
FLOOD_FIGURES = Path("test-artifacts") / "admission-flood.json"


class _Feed:
    def __init__(self, policies: PolicySet) -> None:
        self.current = policies


def _records(settings: Settings, n: int) -> list[ConsumerRecord[bytes, bytes]]:
    token = issue_context_token(context_keys(settings), sub="bench", tenant="tenant-a")
    records = []
    for i in range(n):
        value = json.dumps(
            {
                "v": 1,
                "call_id": f"bench-{uuid.uuid4().hex[:12]}",
                "tool": "get_payment",
                "arguments": {"payment_id": "pay_A1001"},
                "context": token,
                "proposed_at": "2026-12-02T00:00:00+00:00",
            }
        ).encode()
        records.append(ConsumerRecord("t", 0, i, 0, 0, b"k", value, None, 1, len(value), []))
    return records


async def admission_costs(n: int) -> dict[str, Any]:
    """CPU µs per call of the validator handler: plain, admitting all, refusing all."""
    settings = Settings()
    catalog = load_catalog(settings.catalog)
    feed = _Feed(PolicySet.from_directory(DEFAULT_POLICY_DIR))
    redis = redis_client(settings)
    figures: dict[str, Any] = {"admission_n": n}
    try:
        for label, rate in (("plain", None), ("admitted", 1e9), ("refused", 0.001)):
            admission = None
            if rate is not None:
                limits = parse_limits(
                    {
                        "limits": [
                            {"scope": "tenant", "rate": rate, "burst": 1 if rate < 1 else 1e9}
                        ]
                    },
                    source="bench",
                )
                admission = Admission(
                    limiter=FleetLimiter(
                        redis, settings.admission, prefix=f"bench-{uuid.uuid4().hex[:6]}."
                    ),
                    catalog=catalog,
                    keys=context_keys(settings),
                    limits=lambda limits=limits: limits,  # type: ignore[misc]
                    # As the stages run it: fair shares count every verified call.
                    fair=FairShedder(settings.admission),
                )
            handle = validator_handler(
                catalog=catalog,
                limits=Limits(),
                feed=feed,  # type: ignore[arg-type]
                admission=admission,
            )
            records = _records(settings, n)
            await handle(records[:BATCH])  # warm: token cache, script loaded
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(0, n, BATCH):
                await handle(records[i : i + BATCH])
            figures[f"admission_{label}_cpu_us"] = (time.process_time() - cpu) / n * 1e6
            figures[f"admission_{label}_wall_us"] = (time.perf_counter() - wall) / n * 1e6
    finally:
        await redis.aclose()
    figures["admission_refused_published_cpu_us"] = await refused_and_published(
        settings, max(n, 2 * FLOOD_BATCH)
    )
    plain = figures["admission_plain_cpu_us"]
    figures["admission_cost_admitted_us"] = figures["admission_admitted_cpu_us"] - plain
    figures["admission_cost_refused_us"] = figures["admission_refused_cpu_us"] - plain
    return figures


async def refused_and_published(settings: Settings, n: int) -> float:
    """CPU µs per refused record through the validator's loop: handled, published through
    the refusals' producer and acknowledged by the broker (own topics, deleted after)."""
    settings = settings.model_copy(update={"topic_prefix": f"bench{uuid.uuid4().hex[:8]}."})
    await ensure_topics(settings)
    catalog = load_catalog(settings.catalog)
    redis = redis_client(settings)
    limits = parse_limits(
        {"limits": [{"scope": "tenant", "rate": 0.001, "burst": 1}]}, source="bench"
    )
    admission = Admission(
        limiter=FleetLimiter(redis, settings.admission, prefix=f"bench-{uuid.uuid4().hex[:6]}."),
        catalog=catalog,
        keys=context_keys(settings),
        limits=lambda: limits,
        fair=FairShedder(settings.admission),
    )
    producer = kafka_producer(settings, max_batch_size=PRODUCER_BATCH_BYTES)
    refusals = kafka_producer(settings, max_batch_size=PRODUCER_BATCH_BYTES)
    # As the stages publish them: stamped refusals by the handler itself (runtime/bulk.py).
    bulk = BulkRecords(settings, refusals, what="validate")
    handle = validator_handler(
        catalog=catalog,
        limits=Limits(),
        feed=_Feed(PolicySet.from_directory(DEFAULT_POLICY_DIR)),  # type: ignore[arg-type]
        admission=admission,
        bulk=lambda: bulk,
    )
    await producer.start()
    await refusals.start()
    try:
        loop = consumer_loop(
            settings,
            None,  # process() reads nothing
            producer,
            stage="validate",
            group="bench",
            handle=handle,
            batched_sends=True,
            bulk_producer=refusals,
            partition_records=FLOOD_BATCH,
        )
        records = _records(settings, n)
        await loop.process(records[:FLOOD_BATCH])  # warm: token cache, script, metadata
        frozen = gc.get_threshold()
        gc.freeze()  # as every service does (runtime/heap.py)
        gc.set_threshold(YOUNG_OBJECTS, *frozen[1:])
        try:
            cpu = time.process_time()
            for i in range(FLOOD_BATCH, n, FLOOD_BATCH):
                await loop.process(records[i : i + FLOOD_BATCH])
            spent = time.process_time() - cpu
        finally:
            gc.set_threshold(*frozen)
            gc.unfreeze()
    finally:
        await producer.stop()
        await refusals.stop()
        await redis.aclose()
        await delete_topics(settings)
    return spent / (n - FLOOD_BATCH) * 1e6


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(json.dumps(asyncio.run(admission_costs(n)), indent=2))
    print(
        "noisy neighbour: not measured in this run (make bench measures it; "
        "make test-admission-flood alone)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
