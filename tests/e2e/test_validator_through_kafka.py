from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.names import Topic
from tests.e2e.conftest import Pipeline
from tests.matrix import MATRIX, envelope
from tests.services import context_token, outcomes_by_call, publish, read_until, run

pytestmark = pytest.mark.e2e

PASSED_VALIDATION = {"succeeded", "awaiting_approval"}


def test_matrix_through_kafka(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    token = context_token(settings, roles=("support", "refund"))
    run_id = uuid.uuid4().hex[:8]
    ids = {f"mx-{run_id}-{case.id}": case for case in MATRIX}
    now = datetime.now(UTC).isoformat()
    run(
        publish(
            settings,
            [
                (call_id, envelope(case, call_id=call_id, context=token, proposed_at=now))
                for call_id, case in ids.items()
            ],
        )
    )
    seen: dict[str, Any] = {}

    def collect(recs: list[Any]) -> bool:
        seen.update(outcomes_by_call(recs))
        return set(ids) <= set(seen)

    try:
        records = run(
            read_until(
                settings,
                [Topic.OUTCOMES],
                collect,
                timeout=30,
            )
        )
    except TimeoutError as exc:
        raise AssertionError(f"no outcome: {sorted(set(ids) - set(seen))}") from exc
    outcomes = outcomes_by_call(records)
    for call_id, case in ids.items():
        (first, *_rest) = outcomes[call_id]
        if case.code is None:
            assert first["status"] in PASSED_VALIDATION, (case.id, first)
            continue
        assert first["stage"] == "validate", (case.id, first)
        assert first["error"]["code"] == case.code, (case.id, first)
        if case.path is not None:
            assert [f["path"] for f in first["error"]["fields"]] == [case.path], case.id
        assert "Traceback" not in json.dumps(first)


def test_poison_records_are_all_accounted_for(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    marker = uuid.uuid4().hex[:10]
    token = context_token(settings)
    valid: list[tuple[str | None, bytes | None]] = []
    for n in range(1000):
        call_id = f"pz-{marker}-{n}"
        body = {
            "v": 1,
            "call_id": call_id,
            "tool": "get_payment",
            "arguments": {"payment_id": "pay_A1001"},
            "context": token,
            "proposed_at": datetime.now(UTC).isoformat(),
        }
        valid.append((call_id, json.dumps(body).encode()))
    poison_bodies: list[bytes | None] = [
        f"not json {marker}".encode(),
        b"\xff\xfe\xfd" + marker.encode(),
        json.dumps([marker]).encode(),
        json.dumps({"v": 1, "tool": "get_payment", "note": marker}).encode(),
        json.dumps({"v": 3, "call_id": f"pzv-{marker}"}).encode(),
        (b'{"v":1,"call_id":"pzo-' + marker.encode() + b'","pad":"' + b"x" * 70_000 + b'"}'),
        b'{"m":"' + marker.encode() + b'","a":' + b"[" * 5000 + b"]" * 5000 + b"}",
        None,
    ]
    poison = [(f"pp-{marker}-{i}", poison_bodies[i % len(poison_bodies)]) for i in range(20)]
    mixed: list[tuple[str | None, bytes | None]] = []
    for i, item in enumerate(valid):
        mixed.append(item)
        if i % 50 == 25:
            mixed.append(poison[i // 50])
    assert len(mixed) == 1020
    run(publish(settings, mixed))

    valid_ids = {k for k, _ in valid}
    poison_keys = {k for k, _ in poison}

    def counts(records: list[Any]) -> tuple[int, int, int]:
        validated = dead = done = 0
        for r in records:
            if r.topic == settings.topic(Topic.VALIDATED):
                validated += json.loads(r.value)["call_id"] in valid_ids
            elif r.topic == settings.topic(Topic.DEADLETTER):
                dead += r.key is not None and r.key.decode() in poison_keys
            elif r.topic == settings.topic(Topic.OUTCOMES):
                body = json.loads(r.value)
                done += body["call_id"] in valid_ids and body["status"] == "succeeded"
        return validated, dead, done

    records = run(
        read_until(
            settings,
            [Topic.VALIDATED, Topic.DEADLETTER, Topic.OUTCOMES],
            lambda recs: counts(recs) == (1000, 20, 1000),
            timeout=120,
        )
    )
    assert counts(records) == (1000, 20, 1000)
    assert pipeline.alive()
