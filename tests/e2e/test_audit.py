"""The audit log end to end: the sink records every record of the pipeline (secrets masked),
and `ratifier audit show` tells a call's whole story."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import context_token, outcomes_by_call, publish, read_until, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def audited(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    pipeline = start_pipeline(signing_keys, "e2e-audit", audit_sink=True)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def _propose(pipeline: Pipeline, tool: str, arguments: dict[str, Any], **token: Any) -> str:
    call_id = f"au-{uuid.uuid4().hex[:12]}"
    body = {
        "v": 1,
        "call_id": call_id,
        "tool": tool,
        "arguments": arguments,
        "context": context_token(pipeline.settings, **token),
        "proposed_at": "2026-11-29T12:00:00+00:00",
    }
    run(publish(pipeline.settings, [(call_id, json.dumps(body).encode())]))
    return call_id


def _final(pipeline: Pipeline, call_id: str) -> dict[str, Any]:
    records = run(
        read_until(
            pipeline.settings,
            [Topic.OUTCOMES],
            lambda recs: any(
                o["status"] != "awaiting_approval" for o in outcomes_by_call(recs).get(call_id, [])
            ),
            timeout=45,
        )
    )
    return next(o for o in outcomes_by_call(records)[call_id] if o["status"] != "awaiting_approval")


def _audit_rows(pipeline: Pipeline, call_id: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(pipeline.settings.database_url) as conn:
        rows = conn.execute(
            "SELECT stream, status FROM audit_records WHERE prefix = %s AND call_id = %s "
            "ORDER BY record_at, topic, kafka_offset",
            (pipeline.settings.topic_prefix, call_id),
        ).fetchall()
    return [(stream, status) for stream, status in rows]


def _wait_recorded(pipeline: Pipeline, call_id: str, status: str) -> list[tuple[str, str | None]]:
    deadline = time.monotonic() + 30
    while True:
        rows = _audit_rows(pipeline, call_id)
        if ("outcomes", status) in rows:
            return rows
        assert time.monotonic() < deadline, f"not recorded: {rows}"
        time.sleep(0.2)


def test_sink_records_a_denied_cross_tenant_call(audited: Pipeline) -> None:
    call_id = _propose(audited, "get_payment", {"payment_id": "pay_B2001"})
    assert _final(audited, call_id)["status"] == "denied"
    rows = _wait_recorded(audited, call_id, "denied")
    assert [s for s, _ in rows] == ["calls.proposed", "calls.validated", "outcomes"]
