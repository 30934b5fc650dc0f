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

from bench.common import (
    BenchRun,
    create_topics,
    drain,
    machine_facts,
    read_envelopes,
    table,
)
from commands.reference import catalog
from commands.validate import Limits
from config.settings import Settings
from ratifier.processes import WorkerProcess
from schemas.envelopes import SourcePosition
from schemas.names import Topic
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
        started = time.process_time()
        for raw in envelopes:
            on_proposed(raw, source=source, catalog=catalog, limits=limits, now=now, trace_id=None)
        rounds.append((time.process_time() - started) / n * 1e6)
    return statistics.median(rounds), statistics.mean(len(e) for e in envelopes)


async def through_kafka(n: int) -> dict[str, float]:
    """B1 (raw relay, one hop) and the validator stage alone, draining the same backlog."""
    run = BenchRun.create("validator")
    try:
        await run.prepare()
        envelopes = read_envelopes(run.settings, n, uuid.uuid4().hex[:6])
        p = run.settings.topic_prefix
        await create_topics(run, [f"{p}hop0", f"{p}hop1"])

        def relay() -> list[WorkerProcess]:
            return [run.start_module("bench.relay", "relay", f"{p}hop0", f"{p}hop1", f"{p}b1")]

        relay_rate, _ = await drain(run, relay, f"{p}hop0", f"{p}hop1", n, envelopes, 300)

        def validator() -> list[WorkerProcess]:
            return [run.start("streams", "validator", RATIFIER_STREAMS__STAGES="validator")]

        t = run.settings.topic
        rate, _ = await drain(
            run, validator, t(Topic.PROPOSED), t(Topic.VALIDATED), n, envelopes, 600
        )
        return {"relay_calls_per_s": relay_rate, "validator_calls_per_s": rate}
    finally:
        await run.close()


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
                        "validator stage on the runtime loop (backlog drain)",
                        f"{kafka['validator_calls_per_s']:,.0f} calls/s",
                        f"{ratio:.0%} of B1",
                    ],
                ],
                ["what", "measured", "note"],
            ),
            "",
            f"{n} envelopes of about {size:.0f} bytes each. The streams worker runs the "
            "validator stage only (`RATIFIER_STREAMS__STAGES=validator`).",
            "",
        ]
    )
    print(section)  # `make bench` writes bench/RESULTS.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
