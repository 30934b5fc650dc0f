"""Scaling the streams out under load loses nothing: a second worker joins while a burst is
processed (its partitions move mid-stream), and every call still gets its final outcome."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.conftest import SigningKeys, start_pipeline
from tests.services import outcomes_by_call, proposal, publish, read_to_end, read_until, run

pytestmark = pytest.mark.e2e

BURST = 1500
FINAL = {"succeeded", "rejected", "denied", "failed", "conflict", "expired", "cancelled"}


@pytest.mark.timeout(300)
def test_a_worker_joining_mid_burst_loses_no_call(signing_keys: SigningKeys) -> None:
    pipeline = start_pipeline(signing_keys, "rebalance", executors=1)
    try:
        settings = pipeline.settings
        batch = uuid.uuid4().hex[:6]
        calls = [
            proposal(
                settings,
                tool="get_payment",
                arguments={"payment_id": "pay_A1001"},
                call_id=f"rb-{batch}-{n}",
            )
            for n in range(BURST)
        ]
        ids = {c["call_id"] for c in calls}
        # A second worker starts, and the burst arrives while it joins: partitions of every
        # stage move while records are in flight.
        pipeline.start("streams", "streams-2", RATIFIER_STREAMS__HTTP_PORT="0")
        run(publish(settings, [(c["call_id"], json.dumps(c).encode()) for c in calls]))
        started = time.monotonic()

        def answered(records: list[object]) -> bool:
            found = outcomes_by_call(records)
            return all(any(o["status"] in FINAL for o in found.get(c, [])) for c in ids)

        try:
            run(read_until(settings, [Topic.OUTCOMES], answered, timeout=180))
        except TimeoutError:
            found = outcomes_by_call(run(read_to_end(settings, [Topic.OUTCOMES])))
            lost = sorted(c for c in ids if not any(o["status"] in FINAL for o in found.get(c, [])))
            pytest.fail(f"{len(lost)} of {BURST} calls never got a final outcome: {lost[:8]}")
        print(f"rebalance: {BURST} calls answered {time.monotonic() - started:.1f}s after the join")
        assert pipeline.alive()
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))
