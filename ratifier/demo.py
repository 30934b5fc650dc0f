"""`ratifier demo`: run the pipeline on a short scenario and print outcomes as they arrive."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from ratifier.migrate import migrate
from ratifier.processes import WorkerProcess, start_worker
from ratifier.topics import ensure_topics
from schemas.envelopes import Outcome
from schemas.identity import context_keys, issue_context_token
from schemas.names import Topic
from schemas.settings import Settings

LOG_DIR = Path.home() / ".cache" / "ratifier-local" / "logs"


@dataclass(frozen=True, kw_only=True)
class Step:
    title: str
    tool: str
    arguments: dict[str, Any]
    tenant: str
    expect_status: str
    expect_code: str | None


SCENARIO = (
    Step(
        title="own payment",
        tool="get_payment",
        arguments={"payment_id": "pay_A1001"},
        tenant="tenant-a",
        expect_status="succeeded",
        expect_code=None,
    ),
    Step(
        title="other tenant's payment",
        tool="get_payment",
        arguments={"payment_id": "pay_B2001"},
        tenant="tenant-a",
        expect_status="denied",
        expect_code="not_found",
    ),
    Step(
        title="bogus tool",
        tool="refund_everything",
        arguments={},
        tenant="tenant-a",
        expect_status="rejected",
        expect_code="unknown_tool",
    ),
    Step(
        title="injected tenant_id",
        tool="get_payment",
        arguments={"payment_id": "pay_B2001", "tenant_id": "tenant-b"},
        tenant="tenant-a",
        expect_status="rejected",
        expect_code="invalid_arguments",
    ),
    Step(
        title="destructive tool",
        tool="delete_payment_method",
        arguments={"payment_method_id": "pm_A1"},
        tenant="tenant-a",
        expect_status="denied",
        expect_code="policy_denied",
    ),
)

COLUMNS = ("call", "scenario", "tool", "status", "code", "detail", "ok")
WIDTHS = (22, 24, 22, 10, 18, 34, 3)


def _row(values: tuple[str, ...]) -> str:
    return "  ".join(v[:w].ljust(w) for v, w in zip(values, WIDTHS, strict=True))


def _detail(outcome: Outcome) -> str:
    if outcome.result:
        return json.dumps(outcome.result, separators=(",", ":"))
    if outcome.error and outcome.error.fields:
        return "; ".join(f"{f.path}: {f.problem}" for f in outcome.error.fields)
    return outcome.error.message if outcome.error else ""


async def _run_scenario(settings: Settings, run_id: str, wait_seconds: float) -> bool:
    keys = context_keys(settings)
    consumer = AIOKafkaConsumer(
        settings.topic(Topic.OUTCOMES),
        bootstrap_servers=settings.kafka_bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="latest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        # Resolve every partition's end before publishing, so that no outcome is missed.
        for tp in consumer.assignment():
            await consumer.position(tp)
        expected: dict[str, Step] = {}
        for number, step in enumerate(SCENARIO, start=1):
            call_id = f"demo-{run_id}-{number}"
            expected[call_id] = step
            token = issue_context_token(keys, sub="agent-7", tenant=step.tenant, roles=("support",))
            envelope = {
                "v": 1,
                "call_id": call_id,
                "tool": step.tool,
                "arguments": step.arguments,
                "context": token,
                "proposed_at": datetime.now(UTC).isoformat(),
            }
            await producer.send_and_wait(
                settings.topic(Topic.PROPOSED),
                key=call_id.encode(),
                value=json.dumps(envelope).encode(),
            )
        print(
            f"published {len(expected)} calls; waiting for outcomes "
            f"(the first run waits for the workers to join their groups)…",
            flush=True,
        )
        print(_row(COLUMNS))
        print(_row(tuple("-" * w for w in WIDTHS)))
        seen: dict[str, bool] = {}
        deadline = time.monotonic() + wait_seconds
        while len(seen) < len(expected) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    outcome = Outcome.model_validate_json(record.value or b"")
                    step_or_none = expected.get(outcome.call_id)
                    if step_or_none is None or not outcome.terminal:
                        continue
                    code = outcome.error.code.value if outcome.error else ""
                    ok = (
                        outcome.status.value == step_or_none.expect_status
                        and (code or None) == step_or_none.expect_code
                    )
                    seen[outcome.call_id] = ok
                    print(
                        _row(
                            (
                                outcome.call_id,
                                step_or_none.title,
                                outcome.tool or "-",
                                outcome.status.value,
                                code or "-",
                                _detail(outcome),
                                "yes" if ok else "NO",
                            )
                        ),
                        flush=True,
                    )
        missing = [c for c in expected if c not in seen]
        for call_id in missing:
            print(
                f"no outcome within {wait_seconds:.0f}s for {call_id} ({expected[call_id].title})"
            )
        return not missing and all(seen.values())
    finally:
        await consumer.stop()
        await producer.stop()


def run_demo(settings: Settings, *, timeout: float = 120.0) -> int:
    migrate(settings.database_url)
    asyncio.run(ensure_topics(settings))
    run_id = f"{datetime.now(UTC):%H%M%S}-{uuid.uuid4().hex[:4]}"
    workers: list[WorkerProcess] = [
        start_worker("streams", name="demo-streams", log_dir=LOG_DIR),
        start_worker("executor", name="demo-executor", log_dir=LOG_DIR),
    ]
    print(
        f"started streams worker (pid {workers[0].process.pid}) and executor "
        f"(pid {workers[1].process.pid}); logs in {LOG_DIR}",
        flush=True,
    )
    try:
        ok = asyncio.run(_run_scenario(settings, run_id, timeout))
    finally:
        for worker in workers:
            code = worker.stop()
            if code not in (0, -15):
                print(f"{worker.name} exited with {code}; last log lines:\n{worker.log_tail()}")
        print("stopped the workers")
    print("demo: every outcome as expected" if ok else "demo: FAILED (see above)")
    return 0 if ok else 1
