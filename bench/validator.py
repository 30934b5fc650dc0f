"""Validator benchmark: µs per call for the pure function, and calls/s through Kafka next
to a raw aiokafka one-hop relay measured in the same run (same broker, topics, sizes).

Run: ``make bench-validator`` (or ``.venv/bin/python -m bench.validator``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.common import (
    bench_settings,
    count_until,
    machine_facts,
    produce_all,
    read_envelopes,
    table,
    write_results,
)
from commands.reference import catalog
from commands.validate import Limits
from ratifier.migrate import migrate
from ratifier.processes import start_worker
from ratifier.topics import delete_topics, ensure_topics
from schemas.envelopes import SourcePosition
from schemas.names import Topic
from schemas.settings import Settings
from streams.validator import on_proposed

SECTION = "## Validator"


def pure(n: int) -> tuple[float, float]:
    """(median µs per call, envelope bytes) over 5 rounds of ``n`` calls."""
    settings = Settings()
    envelopes = read_envelopes(settings, n, "pure")
    source = SourcePosition(topic="t", partition=0, offset=0)
    limits = Limits()
    now = datetime.now(UTC)
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for raw in envelopes:
            on_proposed(raw, source=source, catalog=catalog, limits=limits, now=now, trace_id=None)
        rounds.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(rounds), statistics.mean(len(e) for e in envelopes)


async def relay(settings: Settings, src: str, dst: str, n: int) -> None:
    """Baseline: getmany → send_batch with no work, until ``n`` records moved."""
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"{settings.topic_prefix}relay",
        auto_offset_reset="earliest",
        max_poll_records=2000,
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    await consumer.start()
    await producer.start()
    moved = 0
    try:
        while moved < n:
            batches = await consumer.getmany(timeout_ms=200, max_records=2000)
            for tp, records in batches.items():
                batch = producer.create_batch()
                for r in records:
                    if batch.append(key=r.key, value=r.value, timestamp=None) is None:
                        await producer.send_batch(batch, dst, partition=tp.partition)
                        batch = producer.create_batch()
                        batch.append(key=r.key, value=r.value, timestamp=None)
                await producer.send_batch(batch, dst, partition=tp.partition)
                moved += len(records)
            await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()


async def through_kafka(n: int) -> dict[str, float]:
    settings = bench_settings()
    migrate(settings.database_url)
    await ensure_topics(settings)
    run_id = uuid.uuid4().hex[:6]
    envelopes = read_envelopes(settings, n, run_id)
    results: dict[str, float] = {}
    try:
        # Baseline first: a raw one-hop relay between two topics of the same shape.
        src, dst = settings.topic(Topic.CANCELLED), settings.topic(Topic.UNKNOWN)
        started = await produce_all(settings, src, envelopes)
        relay_task = asyncio.create_task(relay(settings, src, dst, n))
        start_relay = time.perf_counter()
        done = await count_until(settings, dst, n, timeout=300)
        await relay_task
        results["relay_calls_per_s"] = n / (done - start_relay)
        del started

        # The validator inside the streams worker; backlog published first, then the worker
        # drains it, so the figure is processing throughput, not producer speed.
        await produce_all(settings, settings.topic(Topic.PROPOSED), envelopes)
        env = {
            "RATIFIER_TOPIC_PREFIX": settings.topic_prefix,
            "RATIFIER_DATABASE_URL": settings.database_url,
            "RATIFIER_LOG_LEVEL": "WARNING",
            "RATIFIER_STREAMS_STAGES": "validator",
        }
        worker = start_worker(
            "streams", name="bench-streams", log_dir=Path("test-artifacts") / "bench-logs", env=env
        )
        try:
            first = await count_until(settings, settings.topic(Topic.VALIDATED), 1, timeout=120)
            done = await count_until(settings, settings.topic(Topic.VALIDATED), n, timeout=600)
            results["validator_calls_per_s"] = (n - 1) / max(done - first, 1e-9)
        finally:
            worker.stop()
    finally:
        await delete_topics(settings)
    return results


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    us, size = pure(min(n, 20_000))
    print(f"pure validator: {us:.1f} µs/call ({size:.0f} B envelopes)", flush=True)
    kafka = asyncio.run(through_kafka(n))
    print(f"through Kafka: {kafka}", flush=True)
    ratio = kafka["validator_calls_per_s"] / kafka["relay_calls_per_s"]
    section = "\n".join(
        [
            SECTION,
            "",
            f"Command: `.venv/bin/python -m bench.validator {n}` — {machine_facts()}.",
            "",
            table(
                [
                    [
                        "pure `on_proposed` (parse + validate + build record)",
                        f"{us:.1f} µs/call",
                        f"{1e6 / us:,.0f} calls/s on one core",
                    ],
                    [
                        "B1 raw aiokafka relay, one hop (getmany → send_batch)",
                        f"{kafka['relay_calls_per_s']:,.0f} calls/s",
                        "baseline",
                    ],
                    [
                        "validator stage in the faust worker (backlog drain)",
                        f"{kafka['validator_calls_per_s']:,.0f} calls/s",
                        f"{ratio:.0%} of B1",
                    ],
                ],
                ["what", "measured", "note"],
            ),
            "",
            f"{n} envelopes of about {size:.0f} bytes each. The faust worker runs the validator "
            "stage only (`RATIFIER_STREAMS_STAGES=validator`).",
            "",
        ]
    )
    write_results(SECTION, section)
    print("wrote bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
