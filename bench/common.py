"""Shared pieces of the benchmarks: machine facts, envelopes, Kafka counting."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.identity import context_keys, issue_context_token
from schemas.settings import Settings


def machine_facts() -> str:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    kafka = os.environ.get("RATIFIER_KAFKA_VERSION", "4.4.0")
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git or '?'}, {os.cpu_count()} "
        f"cores ({cpu}), Python {platform.python_version()}, Kafka {kafka} (one node, "
        f"KRaft, loopback), acks=all"
    )


def bench_settings() -> Settings:
    return Settings(
        topic_prefix=f"bench{uuid.uuid4().hex[:8]}.",
        database_url=os.environ.get(
            "RATIFIER_TEST_DATABASE_URL",
            "postgresql://ratifier:ratifier@127.0.0.1:5432/ratifier_test",
        ),
    )


def read_envelopes(settings: Settings, n: int, run_id: str) -> list[bytes]:
    """``n`` valid get_payment proposals, about 800 bytes each (the JWT dominates)."""
    token = issue_context_token(
        context_keys(settings),
        sub="bench-agent",
        tenant="tenant-a",
        roles=("support", "reader", "bench"),
        sid="s" * 40,
    )
    now = datetime.now(UTC).isoformat()
    return [
        json.dumps(
            {
                "v": 1,
                "call_id": f"b-{run_id}-{i}",
                "tool": "get_payment",
                "arguments": {"payment_id": "pay_A1001"},
                "context": token,
                "proposed_at": now,
                "idempotency_key": f"b-{run_id}-{i}",
            }
        ).encode()
        for i in range(n)
    ]


async def produce_all(settings: Settings, topic: str, values: Sequence[bytes]) -> float:
    """Publish ``values`` as fast as the producer allows; return the start time."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [
            await producer.send(topic, value=v, key=str(i).encode()) for i, v in enumerate(values)
        ]
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return started


async def count_until(
    settings: Settings, topic: str, n: int, timeout: float, match: bytes | None = None
) -> float:
    """Consume ``topic`` from the start until ``n`` records (containing ``match``) were seen;
    return the time the last one arrived."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=5000,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    seen = 0
    deadline = time.perf_counter() + timeout
    try:
        while seen < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{topic}: saw {seen} of {n}")
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batches.values():
                seen += sum(1 for r in records if match is None or match in (r.value or b""))
        return time.perf_counter()
    finally:
        await consumer.stop()


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


RESULTS = Path(__file__).parent / "RESULTS.md"


def write_results(heading: str, section: str) -> None:
    """Replace (or append) the section that starts with ``heading`` in bench/RESULTS.md."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + (text[end:] if end >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")
