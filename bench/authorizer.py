"""Authorizer benchmark: Cedar decisions per second, one at a time and batched
(`is_authorized_batch`), and the authorizer stage draining a backlog through Kafka.

Run: ``make bench-authorizer`` (or ``.venv/bin/python -m bench.authorizer``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime

from bench.common import BenchRun, drain, machine_facts, read_envelopes, table
from commands.catalog import Resource
from commands.policy import AuthorizationRequest, PolicySet, authorize, authorize_batch
from commands.reference import catalog
from ratifier.processes import WorkerProcess
from schemas.envelopes import Actor, ValidatedCall
from schemas.names import Topic

SECTION = "## Authorizer"
PAYMENT = Resource(
    kind="payment",
    id="pay_A1001",
    tenant="tenant-a",
    attributes={
        "customer_email": "a@example.com",
        "amount_minor": 4900,
        "currency": "EUR",
        "refundable_minor": 4900,
        "status": "captured",
    },
)


def pure(n: int, batch: int) -> tuple[float, float]:
    """(single decisions/s, batched decisions/s), medians of 5 rounds."""
    policies = PolicySet.from_directory()
    tool = catalog.get("propose_refund")
    assert tool is not None
    requests = [
        AuthorizationRequest(
            actor=Actor(sub=f"agent-{i % 50}", tenant="tenant-a", roles=("refund",)),
            tool=tool,
            resource=PAYMENT,
            arguments={"payment_id": "pay_A1001", "amount_minor": 100 + i % 4000, "reason": "r"},
        )
        for i in range(n)
    ]
    single, batched = [], []
    for _ in range(5):
        # A set of its own per loop: the answers a set keeps (PolicySet.answers) would
        # otherwise answer every round after the first, and this measures Cedar's decisions.
        fresh = dataclasses.replace(policies)
        started = time.process_time()
        for r in requests:
            authorize(
                actor=r.actor,
                tool=r.tool,
                resource=r.resource,
                arguments=r.arguments,
                policies=fresh,
            )
        single.append(n / (time.process_time() - started))
        fresh = dataclasses.replace(policies)
        started = time.process_time()
        for i in range(0, n, batch):
            authorize_batch(requests[i : i + batch], fresh)
        batched.append(n / (time.process_time() - started))
    return statistics.median(single), statistics.median(batched)


async def through_kafka(n: int) -> float:
    """The authorizer stage alone (token check, tenant-scoped load, Cedar) draining ``n``
    validated calls."""
    run = BenchRun.create("authorizer")
    settings = run.settings
    await run.prepare()
    run_id = uuid.uuid4().hex[:6]
    now = datetime.now(UTC)
    validated = []
    for raw in read_envelopes(settings, n, run_id):
        proposal = json.loads(raw)
        validated.append(
            ValidatedCall(
                call_id=proposal["call_id"],
                idempotency_key=proposal["call_id"],
                tool="get_payment",
                arguments=proposal["arguments"],
                context=proposal["context"],
                proposed_at=now,
                validated_at=now,
            ).to_bytes()
        )
    t = run.settings.topic

    def authorizer() -> list[WorkerProcess]:
        return [run.start("streams", "authorizer", RATIFIER_STREAMS__STAGES="authorizer")]

    try:
        # Reads: the authorizer commits them itself, with no `calls.authorized` record
        # (contract v1.8).
        rate, _ = await drain(
            run, authorizer, t(Topic.VALIDATED), t(Topic.COMMITTED), n, validated, 600
        )
        return rate
    finally:
        await run.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    single, batched = pure(min(n, 5_000), batch=200)
    print(f"pure: single {single:,.0f}/s, batched {batched:,.0f}/s", flush=True)
    stage = asyncio.run(through_kafka(n))
    print(f"authorizer stage through Kafka: {stage:,.0f} calls/s", flush=True)
    section = "\n".join(
        [
            SECTION,
            "",
            f"Command: `.venv/bin/python -m bench.authorizer {n}` — {machine_facts()}.",
            "",
            table(
                [
                    [
                        "`authorize` one call at a time (Cedar with schema, parsed policy set)",
                        f"{single:,.0f} decisions/s",
                        f"{1e6 / single:.0f} µs/decision",
                    ],
                    [
                        "`authorize_batch`, 200 per `is_authorized_batch`",
                        f"{batched:,.0f} decisions/s",
                        f"{batched / single:.1f} x single",
                    ],
                    [
                        "authorizer stage in the faust worker (backlog drain: token check, "
                        "tenant-scoped PostgreSQL load, batched Cedar)",
                        f"{stage:,.0f} calls/s",
                        "",
                    ],
                ],
                ["what", "measured", "note"],
            ),
            "",
        ]
    )
    print(section)  # `make bench` writes bench/RESULTS.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
