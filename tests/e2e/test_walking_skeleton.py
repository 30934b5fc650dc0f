from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from schemas.envelopes import TERMINAL_STATUSES
from schemas.names import Topic
from tests.e2e.conftest import Pipeline
from tests.services import json_body, outcomes_by_call, proposal, publish, read_until, run

pytestmark = pytest.mark.e2e

# A read's records: the authorizer commits it with no `calls.authorized` record (v1.8).
PIPELINE_ORDER = [
    Topic.PROPOSED,
    Topic.VALIDATED,
    Topic.COMMITTED,
    Topic.OUTCOMES,
]


def terminal(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in outcomes if o["status"] in {s.value for s in TERMINAL_STATUSES}]


def send_and_wait(
    pipeline: Pipeline, calls: list[dict[str, Any]], topics: list[Topic] | None = None
) -> list[Any]:
    settings = pipeline.settings
    run(publish(settings, [(c["call_id"], json.dumps(c).encode()) for c in calls]))
    ids = {c["call_id"] for c in calls}
    return run(
        read_until(
            settings,
            topics or [Topic.OUTCOMES],
            lambda recs: ids <= {k for k, v in outcomes_by_call(recs).items() if terminal(v)},
            timeout=60,
        )
    )


def test_own_payment_travels_every_stage_in_order(pipeline: Pipeline) -> None:
    call = proposal(pipeline.settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
    records = send_and_wait(pipeline, [call], [*PIPELINE_ORDER, Topic.AUTHORIZED])
    seen: dict[str, list[Any]] = {}
    for record in records:
        body = json_body(record)
        if body is not None and body.get("call_id") == call["call_id"]:
            topic = record.topic.removeprefix(pipeline.settings.topic_prefix)
            seen.setdefault(topic, []).append(record)
    assert list(seen) and set(seen) == {t.value for t in PIPELINE_ORDER}
    stamps = [seen[t.value][0].timestamp for t in PIPELINE_ORDER]
    assert stamps == sorted(stamps), "stages out of order"
    committed = json.loads(seen[Topic.COMMITTED.value][0].value)
    assert committed["operation_id"] == f"tenant-a:{call['call_id']}"
    outcomes = terminal([json.loads(r.value) for r in seen[Topic.OUTCOMES.value]])
    assert len(outcomes) == 1
    (outcome,) = outcomes
    assert outcome["status"] == "succeeded"
    assert outcome["result"]["id"] == "pay_A1001"
    assert outcome["result"]["amount_minor"] == 4900
    assert outcome["tenant"] == "tenant-a"
    assert outcome["policy_version"].startswith("sha256:")
    assert outcome["trace_id"]


def test_other_tenants_payment_and_unknown_tool(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    foreign = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_B2001"})
    bogus = proposal(settings, tool="refund_everything", arguments={})
    injected = proposal(
        settings, tool="get_payment", arguments={"payment_id": "pay_A1001", "is_admin": True}
    )
    records = send_and_wait(pipeline, [foreign, bogus, injected])
    outcomes = outcomes_by_call(records)
    (f,) = terminal(outcomes[foreign["call_id"]])
    assert (f["status"], f["error"]["code"], f["stage"]) == ("denied", "not_found", "authorize")
    assert "pay_B2001" not in json.dumps(f) and "tenant-b" not in json.dumps(f)
    (b,) = terminal(outcomes[bogus["call_id"]])
    assert (b["status"], b["error"]["code"]) == ("rejected", "unknown_tool")
    (i,) = terminal(outcomes[injected["call_id"]])
    assert i["error"]["code"] == "invalid_arguments"
    assert i["error"]["fields"] == [{"path": "$.arguments.is_admin", "problem": "unexpected field"}]


def test_malformed_records_are_deadlettered_and_the_worker_keeps_going(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings
    marker = uuid.uuid4().hex
    poison = [
        (None, f"not json {marker}".encode()),
        (None, b"\xff\xfe" + marker.encode()),
        ("m-" + marker, json.dumps({"v": 9, "call_id": "m-" + marker}).encode()),
    ]
    run(publish(settings, poison))
    good = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1002"})
    send_and_wait(pipeline, [good])

    def raws(records: list[Any]) -> list[bytes]:
        return [base64.b64decode(json.loads(r.value)["raw_base64"]) for r in records]

    letters = run(
        read_until(
            settings,
            [Topic.DEADLETTER],
            lambda recs: sum(marker.encode() in raw for raw in raws(recs)) >= 3,
            timeout=30,
        )
    )
    mine = [
        json.loads(r.value)
        for r in letters
        if marker.encode() in base64.b64decode(json.loads(r.value)["raw_base64"])
    ]
    assert {m["reason"] for m in mine} == {"not JSON", "unsupported or missing version 'v'"}
    assert all(m["source"]["topic"] == settings.topic(Topic.PROPOSED) for m in mine)
    outcome_records = run(
        read_until(
            settings,
            [Topic.OUTCOMES],
            lambda recs: "m-" + marker in outcomes_by_call(recs),
            timeout=30,
        )
    )
    (malformed,) = outcomes_by_call(outcome_records)["m-" + marker]
    assert malformed["error"]["code"] == "malformed"
    assert pipeline.alive()
