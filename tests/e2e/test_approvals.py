"""The seed 001 approval matrix, through Kafka, the join and the executor."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from typing import Any

import pytest

from schemas.envelopes import ApprovalVerdict
from tests.e2e.approvals_kit import (
    REFUND,
    audit,
    committed,
    decide,
    follow,
    http,
    propose,
    publish_decision,
    refusals,
    signed_decision,
    terminal_outcomes,
    token,
    wait_for,
)
from tests.e2e.conftest import Pipeline
from tests.e2e.executor_kit import provider_stats
from tests.services import worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_valid_approval_runs_once_with_its_receipt(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    boss = token(pipeline.settings, "boss")
    first = decide(pipeline, request, boss)
    decide(pipeline, request, boss)  # double confirmation: a second decision
    publish_decision(pipeline, first)  # the same decision replayed
    call_id = request["call_id"]
    found = terminal_outcomes(pipeline, {call_id})[call_id]
    assert len(found) == 1, found
    (outcome,) = found
    assert outcome["status"] == "succeeded", outcome
    assert outcome["approval"]["approver"] == "boss"
    assert outcome["approval"]["fingerprint"] == request["fingerprint"]
    assert outcome["result"]["amount_minor"] == REFUND["amount_minor"]
    assert len(committed(pipeline, {call_id})[call_id]) == 1
    kinds = [k for k, _ in audit(pipeline, call_id)]
    assert kinds[:2] == ["approval_requested", "approval_decision"]
    assert kinds.count("executed") == 1
    wait_for(lambda: len(refusals(pipeline, call_id)) == 2)
    assert sorted(refusals(pipeline, call_id)) == ["decision_reused", "not_pending"]


def test_two_approvers_at_once_commit_one_command(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    tokens = [token(pipeline.settings, f"boss-{n}") for n in range(2)]
    threads = [threading.Thread(target=decide, args=(pipeline, request, t)) for t in tokens]
    # ... and one decision sent three times at once.
    same = signed_decision(pipeline, request, tokens[0])
    threads += [threading.Thread(target=publish_decision, args=(pipeline, same)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    call_id = request["call_id"]
    (outcome,) = terminal_outcomes(pipeline, {call_id})[call_id]
    assert outcome["status"] == "succeeded"
    assert len(committed(pipeline, {call_id})[call_id]) == 1
    assert provider_stats(pipeline.provider_url)["by_key"][outcome["operation_id"]] == 1


def invalid_then_rejected(
    pipeline: Pipeline, request: dict[str, Any], bad_token: str, **change: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """Publish an invalid decision, then a valid reject: when the reject's outcome arrives
    the invalid one was processed (same partition, in order) and must have done nothing."""
    decide(pipeline, request, bad_token, **change)
    decide(
        pipeline,
        request,
        token(pipeline.settings, "boss"),
        ApprovalVerdict.REJECT,
        reason="checked by test",
    )
    call_id = request["call_id"]
    outcomes = terminal_outcomes(pipeline, {call_id})[call_id]
    return outcomes, refusals(pipeline, call_id)


@pytest.mark.parametrize(
    ("who", "change", "reason"),
    [
        (("agent-1", "tenant-a", ("approver",)), {}, "self_approval"),
        (("boss-b", "tenant-b", ("approver",)), {}, "approver_not_permitted"),
        (("clerk", "tenant-a", ("support",)), {}, "approver_not_permitted"),
        (("boss", "tenant-a", ("approver",)), {"fingerprint": "0" * 64}, "fingerprint_mismatch"),
    ],
    ids=["self-approval", "other-tenant", "no-approver-role", "replayed-fingerprint"],
)
def test_invalid_decisions_commit_nothing(
    pipeline: Pipeline,
    who: tuple[str, str, tuple[str, ...]],
    change: dict[str, Any],
    reason: str,
) -> None:
    (request,) = propose(pipeline)
    sub, tenant, roles = who
    outcomes, reasons = invalid_then_rejected(
        pipeline, request, token(pipeline.settings, sub, tenant, roles), **change
    )
    assert [(o["status"], o["error"]["code"]) for o in outcomes] == [
        ("rejected", "approval_rejected")
    ]
    assert committed(pipeline, {request["call_id"]})[request["call_id"]] == []
    assert reasons == [reason]


def test_changed_amount_voids_the_old_consent(pipeline: Pipeline) -> None:
    (first,) = propose(pipeline)
    (changed,) = propose(pipeline, amount_minor=REFUND["amount_minor"] + 5)
    assert first["fingerprint"] != changed["fingerprint"]
    # The human said yes to the first preview; that yes is replayed onto the changed call.
    outcomes, reasons = invalid_then_rejected(
        pipeline, changed, token(pipeline.settings, "boss"), fingerprint=first["fingerprint"]
    )
    assert outcomes[0]["error"]["code"] == "approval_rejected"
    assert reasons == ["fingerprint_mismatch"]
    assert committed(pipeline, {changed["call_id"]})[changed["call_id"]] == []


def test_reject(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    decide(
        pipeline,
        request,
        token(pipeline.settings, "boss"),
        ApprovalVerdict.REJECT,
        reason="customer already refunded",
    )
    (o,) = terminal_outcomes(pipeline, {request["call_id"]})[request["call_id"]]
    assert (o["status"], o["stage"], o["error"]["code"]) == (
        "rejected",
        "approve",
        "approval_rejected",
    )


def test_edit_within_policy_commits_the_edited_arguments(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    edited = {**REFUND, "amount_minor": 3}
    decide(
        pipeline, request, token(pipeline.settings, "boss"), ApprovalVerdict.EDIT, arguments=edited
    )
    call_id = request["call_id"]
    (o,) = terminal_outcomes(pipeline, {call_id})[call_id]
    assert o["status"] == "succeeded", o
    assert o["result"]["amount_minor"] == 3
    assert o["approval"]["approver"] == "boss"
    assert o["approval"]["fingerprint"] != request["fingerprint"]
    (command,) = committed(pipeline, {call_id})[call_id]
    assert command["arguments"] == edited


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({**REFUND, "amount_minor": 10**9}, ("denied", "policy_denied")),
        ({**REFUND, "amount_minor": "3"}, ("rejected", "invalid_arguments")),
        ({**REFUND, "tenant_id": "tenant-b"}, ("rejected", "invalid_arguments")),
    ],
    ids=["beyond-refundable", "wrong-type", "extra-field"],
)
def test_edit_beyond_policy_or_schema_commits_nothing(
    pipeline: Pipeline, arguments: dict[str, Any], expected: tuple[str, str]
) -> None:
    (request,) = propose(pipeline)
    decide(
        pipeline,
        request,
        token(pipeline.settings, "boss"),
        ApprovalVerdict.EDIT,
        arguments=arguments,
    )
    call_id = request["call_id"]
    (o,) = terminal_outcomes(pipeline, {call_id})[call_id]
    assert (o["status"], o["error"]["code"]) == expected
    assert committed(pipeline, {call_id})[call_id] == []


def test_expired_request_and_late_approval(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    call_id = request["call_id"]
    (o,) = terminal_outcomes(
        pipeline, {call_id}, timeout=pipeline.settings.approvals.ttl_seconds + 30
    )[call_id]
    assert (o["status"], o["error"]["code"]) == ("expired", "approval_expired")
    decide(pipeline, request, token(pipeline.settings, "boss"))  # too late
    # The late approval is refused and commits nothing.
    wait_for(lambda: refusals(pipeline, call_id) != [])
    assert refusals(pipeline, call_id) in (["not_pending"], ["statement_expired"])
    assert committed(pipeline, {call_id})[call_id] == []


def test_http_inbox_and_cli(pipeline: Pipeline) -> None:
    first, second = propose(pipeline, n=2)
    boss = token(pipeline.settings, "boss")
    base = f"http://127.0.0.1:{pipeline.http_port}"

    def call(path: str, body: dict[str, Any] | None = None, auth: str = boss) -> Any:
        request = urllib.request.Request(
            base + path,
            method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {auth}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    listed = {r["call_id"] for r in call("/approvals")["pending"]}
    assert {first["call_id"], second["call_id"]} <= listed
    with pytest.raises(urllib.error.HTTPError) as refused:
        call("/approvals", auth=token(pipeline.settings, "clerk", roles=("support",)))
    assert refused.value.code == 403
    refused.value.close()  # an HTTPError holds its response open
    with pytest.raises(urllib.error.HTTPError) as hidden:
        call(
            f"/approvals/{first['call_id']}",
            auth=token(pipeline.settings, "boss-b", tenant="tenant-b"),
        )
    assert hidden.value.code == 404
    hidden.value.close()
    answer = call(f"/approvals/{first['call_id']}/decision", {"decision": "approve"})
    assert answer["fingerprint"] == first["fingerprint"]

    env = {**worker_env(pipeline.settings), "RATIFIER_APPROVER_TOKEN": boss}
    import os

    listing = subprocess.run(
        [sys.executable, "-m", "ratifier.cli", "approvals", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    assert second["call_id"] in listing.stdout
    rejected = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratifier.cli",
            "approvals",
            "reject",
            second["call_id"],
            "--reason",
            "not eligible",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    assert rejected.returncode == 0, rejected.stderr
    outcomes = terminal_outcomes(pipeline, {first["call_id"], second["call_id"]})
    assert outcomes[first["call_id"]][0]["status"] == "succeeded"
    assert outcomes[second["call_id"]][0]["error"]["code"] == "approval_rejected"


def test_http_decisions_are_answered_with_what_became_of_them(pipeline: Pipeline) -> None:
    (request,) = propose(pipeline)
    call_id = request["call_id"]
    path = f"/approvals/{call_id}/decision"
    # The requester approving their own call: refused before anything is published.
    own = token(pipeline.settings, "agent-1", roles=("approver",))
    status, body = http(pipeline, path, own, {"decision": "approve"})
    assert status == 403, body
    assert body["error"]["code"] == "policy_denied"
    assert body["error"]["refusal"] == "self_approval"
    # Arguments on an approve are refused, not ignored.
    boss = token(pipeline.settings, "boss")
    status, body = http(pipeline, path, boss, {"decision": "approve", "arguments": {"x": 1}})
    assert status == 400, body
    assert body["error"]["code"] == "invalid_arguments"
    assert body["error"]["refusal"] == "arguments_without_edit"
    # A valid approval: 202 with the decision id, followed to the join's verdict.
    status, body = http(pipeline, path, boss, {"decision": "approve"})
    assert status == 202, body
    assert body["status"] == "published"
    assert body["follow"] == f"/approvals/{call_id}/decisions/{body['decision_id']}"
    answer = follow(pipeline, body["follow"], boss, {"applied", "refused"})
    assert answer["status"] == "applied", answer
    assert answer["decision_id"] == body["decision_id"]
    (outcome,) = terminal_outcomes(pipeline, {call_id})[call_id]
    assert outcome["status"] == "succeeded", outcome
    assert follow(pipeline, body["follow"], boss, {"applied"})["outcome"] == "succeeded"
    # Neither refused decision reached the join: only the valid one was ever audited.
    decided = [
        d["decision_id"] for k, d in audit(pipeline, call_id) if k.startswith("approval_decision")
    ]
    assert decided == [body["decision_id"]]
    # A decision id nobody published stays "published" (never someone else's verdict).
    unknown = http(pipeline, f"/approvals/{call_id}/decisions/d-unknown", boss)
    assert unknown == (200, {**unknown[1], "status": "published"})
