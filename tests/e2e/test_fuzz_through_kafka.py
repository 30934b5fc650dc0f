"""Fuzzing the real pipeline: generated records on `calls.proposed`, every one answered.

Each record with a readable call id must get an outcome for that call id; every other record
a dead letter carrying its SHA-256. Afterwards a good call still succeeds. `make test` sends a
few hundred records; `make fuzz` sends ten thousand (RATIFIER_FUZZ_KAFKA_RECORDS).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from runtime.identity import context_keys
from schemas.names import Topic
from tests.e2e.conftest import Pipeline
from tests.fuzz.generate import FuzzRecord, record
from tests.fuzz.scale import KAFKA_RECORDS, KAFKA_TIMEOUT
from tests.services import proposal, publish, read_until, run

pytestmark = pytest.mark.e2e


class Answers:
    """What the pipeline answered so far, read incrementally (the topics only grow)."""

    def __init__(self, records: list[FuzzRecord]) -> None:
        self.waiting_calls = {r.call_id for r in records if r.call_id is not None}
        self.waiting_digests = Counter(
            hashlib.sha256(r.raw).hexdigest() for r in records if r.call_id is None
        )
        self.statuses: Counter[str] = Counter()
        self._seen = 0

    def update(self, consumed: list[Any]) -> bool:
        for item in consumed[self._seen :]:
            body = json.loads(item.value)
            if item.topic.endswith(Topic.OUTCOMES.value):
                if body["call_id"] in self.waiting_calls:
                    self.waiting_calls.discard(body["call_id"])
                    self.statuses[body["status"]] += 1
            elif self.waiting_digests.get(body.get("raw_sha256"), 0) > 0:
                self.waiting_digests[body["raw_sha256"]] -= 1
                self.statuses["deadletter"] += 1
        self._seen = len(consumed)
        return not self.waiting_calls and not +self.waiting_digests


@pytest.mark.timeout(KAFKA_TIMEOUT + 120)
def test_every_fuzzed_record_is_answered_and_the_pipeline_still_works(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings
    keys = context_keys(settings)
    rng = random.Random(20261201)
    batch = uuid.uuid4().hex[:6]
    records = [record(rng, keys, n, run=batch) for n in range(KAFKA_RECORDS)]
    started = time.monotonic()
    run(publish(settings, [(r.call_id, r.raw) for r in records]))
    answers = Answers(records)
    try:
        run(
            read_until(
                settings,
                [Topic.OUTCOMES, Topic.DEADLETTER],
                answers.update,
                timeout=KAFKA_TIMEOUT,
            )
        )
    except TimeoutError:
        pytest.fail(
            f"unanswered after {KAFKA_TIMEOUT}s: {len(answers.waiting_calls)} calls "
            f"(e.g. {sorted(answers.waiting_calls)[:5]}), "
            f"{sum(answers.waiting_digests.values())} dead letters; answered {answers.statuses}"
        )
    elapsed = time.monotonic() - started
    print(  # the figures for docs/reliability.md
        f"fuzz through Kafka: {len(records)} records answered in {elapsed:.1f}s; "
        f"kinds {Counter(r.kind for r in records)}; answers {dict(answers.statuses)}"
    )
    assert pipeline.alive(), "a worker exited while answering fuzzed records"
    good = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
    run(publish(settings, [(good["call_id"], json.dumps(good).encode())]))
    after = run(
        read_until(
            settings,
            [Topic.OUTCOMES],
            lambda recs: any(json.loads(r.value)["call_id"] == good["call_id"] for r in recs),
            timeout=60,
        )
    )
    final = [
        json.loads(r.value) for r in after if json.loads(r.value)["call_id"] == good["call_id"]
    ]
    assert final[0]["status"] == "succeeded"
