"""Issue 13 through real Kafka, Redis and PostgreSQL: signed decisions bound to one call,
auto-approval receipts, dead-lettered garbage, and no credential on the topic or in the audit."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from jwt.algorithms import OKPAlgorithm

from commands.policy import DEFAULT_POLICY_DIR
from ratifier.topics import delete_topics
from runtime.identity import context_keys, issue_context_token, sign_call_proof
from schemas.envelopes import ApprovalVerdict, DecisionKind
from schemas.names import Topic
from tests.e2e.approvals_kit import (
    committed,
    decide,
    follow,
    http,
    propose,
    propose_only,
    publish_decision,
    refusals,
    signed_decision,
    terminal_outcomes,
    token,
    wait_for,
)
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import proposal, publish, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

COMPACT_JWS = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+")


DESTRUCTIVE_FORBID = (
    'forbid (principal, action, resource)\nwhen { context.effect == "destructive" };'
)
OPERATORS = """forbid (principal, action, resource)
when { context.effect == "destructive" }
unless { principal.roles.contains("destructive_operator") };

@id("destructive-by-operators")
permit (principal, action, resource)
when { context.effect == "destructive" && resource.tenant == principal.tenant &&
       principal.roles.contains("destructive_operator") };
"""


def operator_policies(directory: Path) -> Path:
    """The reference call policies, except that destructive operators may propose
    destructive calls (which the approver policies then route to four-eyes)."""
    source = DEFAULT_POLICY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".cedar":
            assert DESTRUCTIVE_FORBID in text, "the reference destructive forbid changed"
            text = text.replace(DESTRUCTIVE_FORBID, OPERATORS)
        (directory / path.name).write_text(text, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def secured(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    policies = operator_policies(tmp_path_factory.mktemp("policies"))
    pipeline = start_pipeline(
        signing_keys,
        "e2e-approval-security",
        audit_sink=True,
        RATIFIER_POLICIES__DIRECTORY=str(policies),
        # tenant-b requires call binding; tenant-a (the approval tests) does not.
        RATIFIER_CONTEXT__CALL_BINDING_TENANTS="tenant-b",
    )
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def _reject(pipeline: Pipeline, request: dict[str, Any]) -> dict[str, Any]:
    """A valid reject after the records under test: once its outcome is there, every earlier
    decision of the call was processed (same partition, in order)."""
    decide(pipeline, request, token(pipeline.settings, "boss"), ApprovalVerdict.REJECT)
    (outcome,) = terminal_outcomes(pipeline, {request["call_id"]})[request["call_id"]]
    return outcome


def test_a_decision_readdressed_to_another_call_approves_nothing(secured: Pipeline) -> None:
    first, second = propose(secured, n=2)
    assert first["fingerprint"] == second["fingerprint"]  # same arguments, same fingerprint
    for_first = signed_decision(secured, first, token(secured.settings, "boss"))
    # (a) the body's call id rewritten to the second call, published under its key
    publish_decision(secured, for_first.model_copy(update={"call_id": second["call_id"]}))
    # (b) the first call's unchanged bytes under the second call's key
    publish_decision(secured, for_first, key=second["call_id"])
    outcome = _reject(secured, second)
    assert (outcome["status"], outcome["error"]["code"]) == ("rejected", "approval_rejected")
    assert committed(secured, {second["call_id"]})[second["call_id"]] == []
    assert sorted(refusals(secured, second["call_id"])) == ["body_mismatch", "key_mismatch"]
    # The decision still approves the call it was signed for, and only once.
    publish_decision(secured, for_first)
    (done,) = terminal_outcomes(secured, {first["call_id"]})[first["call_id"]]
    assert done["status"] == "succeeded", done
    assert done["approval"]["decision_ids"] == [for_first.decision_id]


def test_an_auto_approved_write_executes_and_the_audit_names_the_policy(
    secured: Pipeline,
) -> None:
    (call_id,) = propose_only(secured, roles=("refund", "refund_auto"), amount_minor=7)
    (outcome,) = terminal_outcomes(secured, {call_id})[call_id]
    assert outcome["status"] == "succeeded", outcome
    receipt = outcome["approval"]
    assert (receipt["basis"], receipt["auto_policy"]) == (
        "auto",
        "refund-small-auto-for-trusted-agents",
    )
    assert receipt["signature"]

    def shown() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "ratifier.cli", "audit", "show", call_id],
            env={**os.environ, **secured.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result.stdout

    wait_for(lambda: "outcome: succeeded" in shown(), timeout=45)
    text = shown()
    assert "auto-approved by policy refund-small-auto-for-trusted-agents" in text
    assert "precondition_failed" not in text


def test_keyless_and_oversized_decisions_are_dead_lettered_while_others_commit(
    secured: Pipeline,
) -> None:
    requests = propose(secured, n=3)
    boss = token(secured.settings, "boss")
    good = [signed_decision(secured, r, boss) for r in requests]
    keyless = good[0].to_bytes()
    garbage = b"\x00garbage" + os.urandom(900 * 1024)
    marker = f"poison-{time.time_ns()}"
    run(
        publish(
            secured.settings,
            [
                (None, keyless),
                (requests[1]["call_id"], garbage),
                (requests[2]["call_id"], json.dumps({"marker": marker}).encode()),
                *[(d.call_id, d.to_bytes()) for d in good],
            ],
            Topic.APPROVALS_DECIDED,
        )
    )
    ids = {r["call_id"] for r in requests}
    try:
        outcomes = terminal_outcomes(secured, ids)
    except TimeoutError:
        from tests.e2e.approvals_kit import audit

        for c in ids:
            print("AUDIT", c, audit(secured, c))
        dl = run(read_to_end(secured.settings, [Topic.DEADLETTER]))
        print("DL", [json.loads(r.value)["reason"] for r in dl])
        raise
    assert {c: [o["status"] for o in found] for c, found in outcomes.items()} == {
        c: ["succeeded"] for c in ids
    }
    source = secured.settings.topic(Topic.APPROVALS_DECIDED)

    def letters(records: list[Any]) -> list[dict[str, Any]]:
        found = [json.loads(r.value) for r in records]
        return [d for d in found if d.get("source", {}).get("topic") == source]

    records = run(
        read_until(
            secured.settings,
            [Topic.DEADLETTER],
            lambda recs: len(letters(recs)) >= 3,
            timeout=45,
        )
    )
    reasons = sorted(d["reason"] for d in letters(records))
    assert "approval-join: decision without a key" in reasons
    assert "approval-join: oversized decision" in reasons
    assert "approval-join: unreadable decision" in reasons
    for letter in letters(records):
        assert letter["raw_base64"] == ""  # digest and size only
    assert max(d["raw_size"] for d in letters(records)) == len(garbage)


def _jws_types(text: str) -> list[str]:
    """The ``typ`` of every compact JWS in ``text`` (bearer context tokens have none)."""
    found = []
    for match in COMPACT_JWS.finditer(text):
        head = match.group().split(".")[0]
        try:
            header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
        except ValueError:
            header = {}
        found.append(str(header.get("typ", "bearer")))
    return found


def test_no_token_on_the_decided_topic_and_none_in_audit_records(secured: Pipeline) -> None:
    (request,) = propose(secured)
    boss = token(secured.settings, "boss")
    decide(secured, request, boss)
    (done,) = terminal_outcomes(secured, {request["call_id"]})[request["call_id"]]
    assert done["status"] == "succeeded"
    decided = run(read_to_end(secured.settings, [Topic.APPROVALS_DECIDED]))
    text = "\n".join((r.value or b"").decode(errors="replace") for r in decided)
    assert request["call_id"] in text
    assert boss not in text
    # Only signed decision statements: no bearer token, no receipt standing in.
    assert set(_jws_types(text)) == {"ratifier-decision+jws"}

    def recorded() -> bool:
        with psycopg.connect(secured.settings.storage.database_url) as conn:
            (n,) = conn.execute(
                "SELECT count(*) FROM audit_records WHERE prefix = %s AND call_id = %s "
                "AND status = 'succeeded'",
                (secured.settings.topic_prefix, request["call_id"]),
            ).fetchone() or (0,)
        return int(n) > 0

    wait_for(recorded, timeout=45)
    with psycopg.connect(secured.settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT record::text FROM audit_records WHERE prefix = %s",
            (secured.settings.topic_prefix,),
        ).fetchall()
        log = conn.execute("SELECT detail::text FROM audit_log").fetchall()
    audit_text = "\n".join(r[0] or "" for r in rows)
    assert len(rows) > 10
    assert _jws_types(audit_text) == []  # no token of any kind
    assert boss not in audit_text
    assert _jws_types("\n".join(r[0] or "" for r in log)) == []


def propose_deletion(pipeline: Pipeline, prefix: str) -> str:
    """A new card of Alice's, and a proposal to delete it (a four-eyes tool): its call id."""
    method = f"pm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        conn.execute(
            "INSERT INTO payment_methods (tenant, payment_method_id, customer_email, brand, last4)"
            " VALUES ('tenant-a', %s, 'alice@example.com', 'visa', '4242')",
            (method,),
        )
    body = proposal(
        pipeline.settings,
        tool="delete_payment_method",
        arguments={"payment_method_id": method},
        call_id=f"{prefix}-{uuid.uuid4().hex[:12]}",
        context=token(pipeline.settings, "operator-1", roles=("destructive_operator",)),
    )
    run(publish(pipeline.settings, [(body["call_id"], json.dumps(body).encode())]))
    return str(body["call_id"])


def test_an_approver_over_the_amount_is_refused(secured: Pipeline) -> None:
    (large,) = propose(secured, payment_id="pay_A1002", amount_minor=1500)
    clerk = token(secured.settings, "clerk", roles=("refund_clerk",))
    decide(secured, large, clerk)  # clerks approve refunds up to 10.00 only
    decide(secured, large, token(secured.settings, "boss"))
    (done,) = terminal_outcomes(secured, {large["call_id"]})[large["call_id"]]
    assert (done["status"], done["approval"]["approvers"]) == ("succeeded", ["boss"])
    assert refusals(secured, large["call_id"]) == ["approver_not_permitted"]
    (small,) = propose(secured, payment_id="pay_A1002", amount_minor=9)
    decide(secured, small, clerk)
    (done,) = terminal_outcomes(secured, {small["call_id"]})[small["call_id"]]
    assert (done["status"], done["approval"]["approvers"]) == ("succeeded", ["clerk"])


def test_a_customer_confirms_their_own_action_and_not_anothers(secured: Pipeline) -> None:
    (bobs,) = propose(secured, payment_id="pay_A1002", amount_minor=3)  # bob's payment
    assert bobs["subject"] == "bob@example.com"
    bob = token(secured.settings, "bob@example.com", roles=())
    alice = token(secured.settings, "alice@example.com", roles=())
    path = f"/confirmations/{bobs['call_id']}"
    # Alice can neither see nor confirm Bob's action; an approver API is no way in either.
    assert http(secured, path, alice)[0] == 404
    assert http(secured, path, alice, {"decision": "approve"})[0] == 404
    assert http(secured, f"/approvals/{bobs['call_id']}", alice)[0] == 403
    # A confirmation signed for Alice reaching the join some other way is refused too.
    publish_decision(secured, signed_decision(secured, bobs, alice, kind=DecisionKind.CONFIRMATION))
    status, shown = http(secured, path, bob)
    assert (status, shown["preview"]) == (200, bobs["preview"])
    status, answer = http(secured, path, bob, {"decision": "approve"})
    assert (status, answer["fingerprint"]) == (202, bobs["fingerprint"])
    (done,) = terminal_outcomes(secured, {bobs["call_id"]})[bobs["call_id"]]
    assert done["status"] == "succeeded", done
    assert (done["approval"]["approvers"], done["approval"]["basis"]) == (
        ["bob@example.com"],
        "confirmation",
    )
    assert refusals(secured, bobs["call_id"]) == ["approver_not_permitted"]


def test_four_eyes_needs_two_distinct_approvers(secured: Pipeline) -> None:
    call_id = propose_deletion(secured, "fe")
    records = run(
        read_until(
            secured.settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: any(json.loads(r.value)["call_id"] == call_id for r in recs),
            timeout=45,
        )
    )
    request = next(
        json.loads(r.value) for r in records if json.loads(r.value)["call_id"] == call_id
    )
    assert request["required_approvals"] == 2
    boss = token(secured.settings, "boss")
    decide(secured, request, boss)
    decide(secured, request, boss)  # the same person again does not count twice
    wait_for(lambda: refusals(secured, call_id) == ["same_approver"])
    assert committed(secured, {call_id})[call_id] == []
    decide(secured, request, token(secured.settings, "boss-2"))
    (done,) = terminal_outcomes(secured, {call_id})[call_id]
    assert done["status"] == "succeeded", done
    assert done["approval"]["approvers"] == ["boss", "boss-2"]


def test_with_binding_required_a_copied_context_token_is_unauthenticated(
    secured: Pipeline,
) -> None:
    runtime = ed25519.Ed25519PrivateKey.generate()
    jwk = OKPAlgorithm.to_jwk(runtime.public_key(), as_dict=True)
    context = issue_context_token(
        context_keys(secured.settings),
        sub="agent-b",
        tenant="tenant-b",
        roles=("support",),
        cnf_jwk=jwk,
    )
    arguments = {"payment_id": "pay_B2001"}

    def proposal(call_id: str, proof: str | None) -> tuple[str, bytes]:
        body = {
            "v": 1,
            "call_id": call_id,
            "tool": "get_payment",
            "arguments": arguments,
            "context": context,
            "proposed_at": datetime.now(UTC).isoformat(),
            "proof": proof,
        }
        return call_id, json.dumps(body).encode()

    bound = f"bd-{uuid.uuid4().hex[:12]}"
    proof = sign_call_proof(
        runtime,
        call_id=bound,
        idempotency_key=bound,
        tool="get_payment",
        arguments=arguments,
        context=context,
    )
    run(publish(secured.settings, [proposal(bound, proof)]))
    (done,) = terminal_outcomes(secured, {bound})[bound]
    assert done["status"] == "succeeded", done
    # A reader of calls.proposed copies the token (and the proof) onto new calls.
    copied = run(
        read_until(
            secured.settings,
            [Topic.PROPOSED],
            lambda recs: any(json.loads(r.value).get("call_id") == bound for r in recs),
        )
    )
    original = next(json.loads(r.value) for r in copied if json.loads(r.value)["call_id"] == bound)
    assert original["context"] == context
    forged = [f"bd-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    run(
        publish(
            secured.settings,
            [proposal(forged[0], None), proposal(forged[1], original["proof"])],
        )
    )
    outcomes = terminal_outcomes(secured, set(forged))
    for call_id in forged:
        (o,) = outcomes[call_id]
        assert (o["status"], o["error"]["code"]) == ("denied", "unauthenticated"), o


def test_four_eyes_through_the_http_api_refuses_the_same_approver_twice(
    secured: Pipeline,
) -> None:
    call_id = propose_deletion(secured, "fh")
    boss, boss_2 = token(secured.settings, "boss"), token(secured.settings, "boss-2")
    path = f"/approvals/{call_id}/decision"

    def listed() -> bool:
        status, found = http(secured, f"/approvals/{call_id}", boss)
        return status == 200 and found["required_approvals"] == 2

    wait_for(listed, timeout=45)
    status, first = http(secured, path, boss, {"decision": "approve"})
    assert status == 202, first
    waiting = follow(secured, first["follow"], boss, {"waiting_for_another_approver", "refused"})
    assert waiting["status"] == "waiting_for_another_approver", waiting
    assert (waiting["approvals"], waiting["required_approvals"]) == (1, 2)
    # The same person again: refused with a typed conflict, nothing published.
    status, again = http(secured, path, boss, {"decision": "approve"})
    assert status == 409, again
    assert again["error"]["code"] == "conflict"
    assert again["error"]["refusal"] == "same_approver"
    assert refusals(secured, call_id) == []
    status, second = http(secured, path, boss_2, {"decision": "approve"})
    assert status == 202, second
    applied = follow(secured, second["follow"], boss_2, {"applied", "refused"})
    assert applied["status"] == "applied", applied
    (done,) = terminal_outcomes(secured, {call_id})[call_id]
    assert done["status"] == "succeeded", done
    assert done["approval"]["approvers"] == ["boss", "boss-2"]
    # The first approval, followed again, now shows the call applied.
    assert follow(secured, first["follow"], boss, {"applied"})["outcome"] == "succeeded"
