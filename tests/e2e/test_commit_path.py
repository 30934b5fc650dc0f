"""Who commits a read (streams/commit.py): the authorizer, once, with no `calls.authorized`
record (contract v1.8); the approval-join skips the marked record a v1.4 to v1.7 authorizer
published for such a read, and still commits a pre-v1.4 authorizer's unmarked one."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from schemas.envelopes import TERMINAL_STATUSES
from schemas.names import STREAMS_APP_ID, Topic
from tests.e2e.conftest import Pipeline
from tests.services import (
    commit_lag,
    json_body,
    outcomes_by_call,
    proposal,
    publish,
    read_to_end,
    read_until,
    run,
)

pytestmark = pytest.mark.e2e

FINAL = {s.value for s in TERMINAL_STATUSES}


def finished(pipeline: Pipeline, call_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    records = run(
        read_until(
            pipeline.settings,
            [Topic.OUTCOMES],
            lambda recs: (
                call_ids
                <= {
                    c
                    for c, found in outcomes_by_call(recs).items()
                    if {o["status"] for o in found} & FINAL
                }
            ),
            timeout=60,
        )
    )
    return outcomes_by_call(records)


def bodies(pipeline: Pipeline, topic: Topic, call_id: str) -> list[dict[str, Any]]:
    found = [json_body(r) for r in run(read_to_end(pipeline.settings, [topic]))]
    return [b for b in found if b is not None and b.get("call_id") == call_id]


def older_record(command: dict[str, Any]) -> dict[str, Any]:
    """The marked `calls.authorized` record a v1.4 to v1.7 authorizer published for the read
    whose `commands.committed` record is ``command``."""
    return {
        "v": command["v"],
        "call_id": command["call_id"],
        "operation_id": command["operation_id"],
        "idempotency_key": command["operation_id"].removeprefix(f"{command['tenant']}:"),
        "tenant": command["tenant"],
        "actor": command["actor"],
        "tool": command["tool"],
        "arguments": command["arguments"],
        "fingerprint": command["fingerprint"],
        "effect": command["effect"],
        "policy_version": command["policy_version"],
        "route": "auto",
        "proposed_at": command["committed_at"],
        "authorized_at": command["committed_at"],
        "policies": command["policies"],
        "committed": True,
    }


def renamed(body: dict[str, Any], call_id: str) -> dict[str, Any]:
    """``body`` (a `calls.authorized` record) for another call of the same tenant."""
    return {
        **body,
        "call_id": call_id,
        "idempotency_key": call_id,
        "operation_id": f"{body['tenant']}:{call_id}",
    }


def test_a_read_is_committed_once_by_the_authorizer_and_an_older_record_by_the_join(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings
    call = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
    run(publish(settings, [(call["call_id"], json.dumps(call).encode())]))
    (outcome,) = finished(pipeline, {call["call_id"]})[call["call_id"]]
    assert outcome["status"] == "succeeded"
    assert bodies(pipeline, Topic.AUTHORIZED, call["call_id"]) == []  # v1.8: none
    (committed,) = bodies(pipeline, Topic.COMMITTED, call["call_id"])
    assert committed["approval"] is None
    assert committed["policies"]  # the permits that allowed it: on the command since v1.8

    # Upgrade: a pre-v1.4 authorizer's record (no `committed`) is the join's to commit; a
    # v1.4 to v1.7 one, marked, that nobody committed stays uncommitted (the join never
    # doubles a commit).
    authorized = older_record(committed)
    tag = uuid.uuid4().hex[:10]
    older = {k: v for k, v in renamed(authorized, f"older-{tag}").items() if k != "committed"}
    marked = renamed(authorized, f"marked-{tag}")
    run(
        publish(
            settings,
            [(b["call_id"], json.dumps(b).encode()) for b in (marked, older)],
            topic=Topic.AUTHORIZED,
        )
    )
    (answered,) = finished(pipeline, {older["call_id"]})[older["call_id"]]
    assert answered["status"] == "succeeded"
    # Every calls.authorized record, the marked one included, was taken by the join.
    assert run(commit_lag(settings, [(STREAMS_APP_ID, Topic.AUTHORIZED)])) == {}
    (again,) = bodies(pipeline, Topic.COMMITTED, older["call_id"])
    assert again["approval"] is None and again["operation_id"] == older["operation_id"]
    assert bodies(pipeline, Topic.COMMITTED, marked["call_id"]) == []
    assert bodies(pipeline, Topic.OUTCOMES, marked["call_id"]) == []
