"""The audit log end to end: the sink records every record of the pipeline (secrets masked),
and `ratifier audit show` tells a call's whole story."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from ratifier.topics import delete_topics
from schemas.envelopes import ApprovalVerdict
from schemas.names import Topic
from tests.e2e.approvals_kit import decide, propose, token
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import (
    context_token,
    outcomes_by_call,
    publish,
    read_to_end,
    read_until,
    run,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def audited(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    pipeline = start_pipeline(signing_keys, "e2e-audit", audit_sink=True)
    try:
        yield pipeline
        # SIGTERM: the sink finishes its batch, reports and exits cleanly.
        sink = pipeline.worker("audit-sink")
        assert sink.stop() == 0, sink.log_tail()
        assert "audit sink stopping" in sink.log_tail()
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
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
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


def _show(pipeline: Pipeline, call_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratifier.cli", "audit", "show", call_id, *args],
        env={**os.environ, **pipeline.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _in_order(text: str, steps: list[str]) -> None:
    """Every step appears in ``text``, each after the one before."""
    position = 0
    for step in steps:
        found = text.find(step, position)
        assert found >= 0, f"{step!r} missing (or out of order) in:\n{text}"
        position = found + len(step)


def test_sink_records_a_denied_cross_tenant_call(audited: Pipeline) -> None:
    call_id = _propose(audited, "get_payment", {"payment_id": "pay_B2001"})
    final = _final(audited, call_id)
    assert final["status"] == "denied"
    rows = _wait_recorded(audited, call_id, "denied")
    assert [s for s, _ in rows] == ["calls.proposed", "calls.validated", "outcomes"]

    shown = _show(audited, call_id)
    assert shown.returncode == 0, shown.stderr
    _in_order(
        shown.stdout,
        [
            f"call {call_id}",
            "tenant tenant-a",
            "final outcome: denied",
            "proposed",
            '{"payment_id": "pay_B2001"}',
            "agent-1 @ tenant-a",
            "validated",
            "outcome: denied (not_found)",
            "another tenant",
            f"policy_version  {final['policy_version']}",
        ],
    )
    assert "executor" not in shown.stdout  # nothing was executed

    as_json = json.loads(_show(audited, call_id, "--json").stdout)
    assert [e["source"].split()[0] for e in as_json["events"]] == [
        "calls.proposed",
        "calls.validated",
        "outcomes",
    ]
    # The story is the tenant's own: another tenant's view of the call id is empty.
    other = _show(audited, call_id, "--tenant", "tenant-b")
    assert other.returncode == 1
    assert "no audit records" in other.stderr


def test_audit_show_reconstructs_an_approved_refund(audited: Pipeline) -> None:
    (request,) = propose(audited)
    call_id = request["call_id"]
    decide(audited, request, token(audited.settings, "approver-7"), ApprovalVerdict.APPROVE)
    final = _final(audited, call_id)
    assert final["status"] == "succeeded"
    _wait_recorded(audited, call_id, "succeeded")

    shown = _show(audited, call_id)
    assert shown.returncode == 0, shown.stderr
    _in_order(
        shown.stdout,
        [
            "tool propose_refund",
            "final outcome: succeeded",
            "proposed",
            "agent-1 @ tenant-a (roles: refund; token verified)",
            "validated",
            "authorized: policy permits — needs approval",
            f"policy_version  {request['policy_version']}",
            "approval requested",
            "requested_by",
            "agent-1",
            "decision received: approve",
            "approver-7",
            "decision accepted: approve by approver-7",
            "command committed for execution",
            "approved by approver-7",
            "ledger entry claimed",
            "executed, recorded in the ledger: succeeded",
            "outcome: succeeded",
            f"resource_id     {final['resource_id']}",
        ],
    )
    assert "unknown call" not in shown.stdout
    assert "outcome: awaiting_approval (approval_required)" in shown.stdout
    _in_order(shown.stdout, ["ledger now: succeeded", "ledger_attempts"])


def test_audit_show_of_an_unknown_call_fails_clearly(audited: Pipeline) -> None:
    shown = _show(audited, f"never-{uuid.uuid4().hex[:8]}")
    assert shown.returncode == 1
    assert "no audit records for call" in shown.stderr
    assert shown.stdout == ""


def test_secret_argument_is_nowhere_in_clear(audited: Pipeline) -> None:
    """A payout account's number goes through proposal, approval and execution; afterwards
    it is in no row of any table and on no outcome — only its salted hash is kept."""
    secret = "DE89" + "".join(str(secrets.randbelow(10)) for _ in range(18))
    settings = audited.settings
    call_id = f"au-secret-{uuid.uuid4().hex[:8]}"
    body: dict[str, Any] = {
        "v": 1,
        "call_id": call_id,
        "tool": "add_payout_account",
        "arguments": {
            "payment_id": "pay_A1001",
            "account_holder": "Alice Example",
            "account_number": secret,
        },
        "context": context_token(settings, roles=("refund",)),
        "proposed_at": "2026-11-29T12:00:00+00:00",
    }
    # The same secret also in a malformed proposal (dead-lettered: its raw bytes are kept) and
    # in an OpenAI-format call (arguments as a JSON string), both rejected by the validator.
    malformed_id, openai_id = f"{call_id}-malformed", f"{call_id}-openai"
    malformed = {**body, "call_id": malformed_id}
    del malformed["proposed_at"]
    openai_call = {
        **{k: v for k, v in body.items() if k not in ("tool", "arguments")},
        "call_id": openai_id,
        "format": "openai",
        "call": {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "add_payout_account",
                "arguments": json.dumps({**body["arguments"], "payment_id": "bad"}),
            },
        },
    }
    run(
        publish(
            settings,
            [(c["call_id"], json.dumps(c).encode()) for c in (body, malformed, openai_call)],
        )
    )
    requests = run(
        read_until(
            settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: any(json.loads(r.value)["call_id"] == call_id for r in recs),
            timeout=45,
        )
    )
    request = next(
        json.loads(r.value) for r in requests if json.loads(r.value)["call_id"] == call_id
    )
    assert request["arguments"]["account_number"] == "***"
    decide(audited, request, token(settings, "approver-7"), ApprovalVerdict.APPROVE)
    final = _final(audited, call_id)
    assert final["status"] == "succeeded", final
    assert final["result"]["account_last4"] == secret[-4:]
    _wait_recorded(audited, call_id, "succeeded")
    assert ("calls.deadletter", None) in _wait_recorded(audited, malformed_id, "rejected")
    _wait_recorded(audited, openai_id, "rejected")

    with psycopg.connect(settings.storage.database_url) as conn:
        masked = conn.execute(
            "SELECT record -> 'arguments' ->> 'account_number' FROM audit_records "
            "WHERE prefix = %s AND call_id = %s AND stream = 'calls.proposed'",
            (settings.topic_prefix, call_id),
        ).fetchone()
        assert masked is not None and masked[0].startswith("sha256:")
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        ]
        assert {"audit_records", "audit_log", "command_ledger", "payout_accounts"} <= set(tables)
        leaks = {
            name: count
            for name in tables
            if (
                count := conn.execute(
                    sql.SQL("SELECT count(*) FROM {} AS t WHERE t::text LIKE %s").format(
                        sql.Identifier(name)
                    ),
                    (f"%{secret}%",),
                ).fetchone()[0]  # type: ignore[index]
            )
        }
    assert leaks == {}
    outcomes = run(read_to_end(settings, [Topic.OUTCOMES]))
    assert any(call_id.encode() in (r.value or b"") for r in outcomes)
    assert not [r for r in outcomes if secret.encode() in (r.value or b"")]
    # The proposal itself carried it (the agent's input): the check above is not vacuous.
    proposals = run(read_to_end(settings, [Topic.PROPOSED]))
    assert any(secret.encode() in (r.value or b"") for r in proposals)
