"""Helpers for the approval e2e tests: propose refunds, find their requests, decide."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from approvals.signing import approval_keys, sign_decision, statement_for
from config.settings import Settings
from runtime.identity import context_keys, issue_context_token, verify_context_token
from schemas.envelopes import ApprovalDecision, ApprovalVerdict
from schemas.names import Topic
from tests.e2e.conftest import Pipeline
from tests.services import outcomes_by_call, publish, read_to_end, read_until, run

REFUND: dict[str, Any] = {"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late delivery"}


def token(
    settings: Settings, sub: str, tenant: str = "tenant-a", roles: tuple[str, ...] = ("approver",)
) -> str:
    return issue_context_token(context_keys(settings), sub=sub, tenant=tenant, roles=roles)


def propose(pipeline: Pipeline, n: int = 1, **change: Any) -> list[dict[str, Any]]:
    """Propose ``n`` refunds as agent-1 (refund role); return their approval requests."""
    ids = propose_only(pipeline, n, **change)
    records = run(
        read_until(
            pipeline.settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: set(ids) <= {json.loads(r.value)["call_id"] for r in recs},
            timeout=45,
        )
    )
    found = {json.loads(r.value)["call_id"]: json.loads(r.value) for r in records}
    return [found[cid] for cid in ids]


def propose_only(
    pipeline: Pipeline, n: int = 1, roles: tuple[str, ...] = ("refund",), **change: Any
) -> list[str]:
    """Propose ``n`` refunds as agent-1; return their call ids."""
    settings = pipeline.settings
    requester = token(settings, "agent-1", roles=roles)
    ids = [f"ap-{uuid.uuid4().hex[:12]}" for _ in range(n)]
    run(
        publish(
            settings,
            [
                (
                    cid,
                    json.dumps(
                        {
                            "v": 1,
                            "call_id": cid,
                            "tool": "propose_refund",
                            "arguments": {**REFUND, **change},
                            "context": requester,
                            "proposed_at": datetime.now(UTC).isoformat(),
                        }
                    ).encode(),
                )
                for cid in ids
            ],
        )
    )
    return ids


def signed_decision(
    pipeline: Pipeline,
    request: dict[str, Any],
    approver_token: str,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    **change: Any,
) -> ApprovalDecision:
    """What the approval service publishes for a human: it verifies the approver's token,
    then signs a statement about the request (``change`` overrides statement fields)."""
    settings = pipeline.settings
    approver = verify_context_token(approver_token, context_keys(settings))
    keys = approval_keys(settings)
    body: dict[str, Any] = {
        "call_id": request["call_id"],
        "tenant": request["tenant"],
        "fingerprint": request["fingerprint"],
        "approver": approver,
        "verdict": verdict,
        "now": datetime.now(UTC),
        "validity": keys.decision_validity,
    }
    return sign_decision(statement_for(**{**body, **change}), keys)


def publish_decision(
    pipeline: Pipeline, decision: ApprovalDecision, key: str | None = None
) -> None:
    run(
        publish(
            pipeline.settings,
            [(key or decision.call_id, decision.to_bytes())],
            Topic.APPROVALS_DECIDED,
        )
    )


def decide(
    pipeline: Pipeline,
    request: dict[str, Any],
    approver_token: str,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    **change: Any,
) -> ApprovalDecision:
    decision = signed_decision(pipeline, request, approver_token, verdict, **change)
    publish_decision(pipeline, decision)
    return decision


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Poll ``condition`` until it holds (the audit is written asynchronously)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def refusals(pipeline: Pipeline, call_id: str) -> list[str]:
    return [
        str(d.get("refusal"))
        for k, d in audit(pipeline, call_id)
        if k == "approval_decision_refused"
    ]


def terminal_outcomes(
    pipeline: Pipeline, call_ids: set[str], timeout: float = 45
) -> dict[str, list[dict[str, Any]]]:
    def ended(recs: list[Any]) -> bool:
        found = outcomes_by_call(recs)
        return all(
            any(o["status"] != "awaiting_approval" for o in found.get(c, [])) for c in call_ids
        )

    records = run(read_until(pipeline.settings, [Topic.OUTCOMES], ended, timeout=timeout))
    found = outcomes_by_call(records)
    return {c: [o for o in found[c] if o["status"] != "awaiting_approval"] for c in call_ids}


def committed(pipeline: Pipeline, call_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    records = run(read_to_end(pipeline.settings, [Topic.COMMITTED]))
    found: dict[str, list[dict[str, Any]]] = {c: [] for c in call_ids}
    for record in records:
        body = json.loads(record.value)
        if body["call_id"] in found:
            found[body["call_id"]].append(body)
    return found


def audit(pipeline: Pipeline, call_id: str) -> list[tuple[str, dict[str, Any]]]:
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT kind, detail FROM audit_log WHERE call_id = %s ORDER BY id", (call_id,)
        ).fetchall()
    return [(kind, detail) for kind, detail in rows]


def call_history(pipeline: Pipeline, call_id: str, *, since: float) -> str:
    """What happened to one call, for a failed assertion: its audit rows (seconds after
    ``since``, a `time.time()`) and what each worker's log says about partitions and seeks."""
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM at), kind, detail FROM audit_log"
            " WHERE call_id = %s ORDER BY id",
            (call_id,),
        ).fetchall()
    lines = [f"audit of {call_id}:"]
    lines += [
        f"  +{float(at) - since:7.2f}s {kind} {json.dumps(detail)[:300]}"
        for at, kind, detail in rows
    ]
    # Every worker's log, stopped ones too: a restart test's lost record may be the old one's.
    for log in sorted(pipeline.log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime):
        text = log.read_text(encoding="utf-8", errors="replace")
        noted = [line for line in text.splitlines() if any(m in line for m in _PARTITION_MARKS)]
        lines.append(f"--- {log.stem} ({len(noted)} partition lines)")
        lines += noted[-30:]
    return "\n".join(lines)


_PARTITION_MARKS = (
    "approval-join owns",
    "approval-join ready",
    "approval-join started",
    "records a stopped worker left",
    "approval-join stopped",
    "offset commit failed",
    "ERROR",
    "Traceback",
)


def http(
    pipeline: Pipeline, path: str, auth: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    """One call to the streams worker's approval API: (HTTP status, JSON body)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{pipeline.http_port}{path}",
        method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {auth}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # an HTTPError holds its response open
            return exc.code, json.loads(exc.read() or b"null")


def follow(pipeline: Pipeline, path: str, auth: str, until: set[str]) -> dict[str, Any]:
    """Poll a decision's status URL until its status is one of ``until``."""
    seen: list[dict[str, Any]] = []

    def reached() -> bool:
        status, body = http(pipeline, path, auth)
        assert status == 200, body
        seen.append(body)
        return body["status"] in until

    wait_for(reached, timeout=45)
    return seen[-1]
