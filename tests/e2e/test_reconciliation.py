"""Unknown outcomes are settled exactly once, from the provider's own record, or escalated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.e2e.executor_kit import (
    provider_stats,
    publish_commands,
    refund_command,
    seed_payments,
)
from tests.services import context_token, outcomes_by_call, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RECONCILER_ENV = {
    "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.2",
    "RATIFIER_RECONCILER__ATTEMPTS": "4",
}


@pytest.fixture
def pipeline_with_reconciler(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    pipeline = start_pipeline(
        signing_keys,
        f"reconcile-{uuid.uuid4().hex[:4]}",
        streams=False,
        RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS="3",
        RATIFIER_EXECUTOR__RETRY_ATTEMPTS="2",
    )
    seed_payments(pipeline.settings)
    park_leftovers(pipeline)
    pipeline.start("reconciler", "reconciler", **RECONCILER_ENV)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def park_leftovers(pipeline: Pipeline) -> None:
    """The test database is shared by every session on this machine: unknown operations
    left by an interrupted earlier run are escalated here, so that this test's reconciler
    does not send them to this test's provider (it would, correctly, and spend its faults)."""
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        conn.execute(
            "UPDATE command_ledger SET escalated_at = now() "
            "WHERE status = 'unknown' AND escalated_at IS NULL"
        )
        # Settled outcomes an interrupted run never published belong to its topics, not ours.
        conn.execute("UPDATE settlement_outbox SET published_at = now() WHERE published_at IS NULL")


def faults(pipeline: Pipeline, **change: Any) -> None:
    method = "POST" if change else "DELETE"
    request = urllib.request.Request(
        f"{pipeline.provider_url}/_faults",
        method=method,
        data=json.dumps(change).encode() if change else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def outcomes_until(
    pipeline: Pipeline,
    call_id: str,
    statuses: set[str],
    timeout: float = 90,
    *,
    code: str | None = None,
) -> list[dict[str, Any]]:
    """The call's outcomes once one of them has a status in ``statuses`` (and, given
    ``code``, that error code)."""

    def found(o: dict[str, Any]) -> bool:
        return o["status"] in statuses and (
            code is None or (o.get("error") or {}).get("code") == code
        )

    records = run(
        read_until(
            pipeline.settings,
            [Topic.OUTCOMES],
            lambda recs: any(found(o) for o in outcomes_by_call(recs).get(call_id, [])),
            timeout=timeout,
        )
    )
    return outcomes_by_call(records)[call_id]


def ledger(pipeline: Pipeline, operation_id: str) -> dict[str, Any]:
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        row = conn.execute(
            "SELECT status, reconcile_attempts, escalated_at FROM command_ledger "
            "WHERE operation_id = %s",
            (operation_id,),
        ).fetchone()
    assert row is not None
    return {"status": row[0], "attempts": row[1], "escalated": row[2] is not None}


def due_elsewhere(pipeline: Pipeline) -> int:
    """Unknown, unescalated operations in the shared ledger: each takes a turn of the
    reconciler's checks (a diagnosis when a schedule seems not to run)."""
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM command_ledger WHERE status = 'unknown' AND escalated_at IS NULL"
        ).fetchone()
    return int(row[0]) if row else 0


def refund_status(pipeline: Pipeline, operation_id: str) -> str:
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        row = conn.execute(
            "SELECT status FROM refunds WHERE operation_id = %s", (operation_id,)
        ).fetchone()
    return str(row[0]) if row else "none"


def test_lost_response_is_reconciled_to_succeeded_once(pipeline_with_reconciler: Pipeline) -> None:
    pipeline = pipeline_with_reconciler
    faults(pipeline, drop_after=1)
    command = refund_command(f"lost-{uuid.uuid4().hex[:10]}")
    publish_commands(pipeline.settings, [command])
    seen = outcomes_until(pipeline, command.call_id, {"succeeded"})
    assert [(o["status"], o["stage"]) for o in seen] == [
        ("unknown", "execute"),
        ("succeeded", "reconcile"),
    ]
    assert seen[1]["result"]["provider_ref"].startswith("prv_")
    assert seen[1]["policy_version"] == seen[0]["policy_version"] == command.policy_version
    assert provider_stats(pipeline.provider_url)["by_key"][command.operation_id] == 1
    assert ledger(pipeline, command.operation_id)["status"] == "succeeded"
    assert refund_status(pipeline, command.operation_id) == "succeeded"


def test_request_that_never_arrived_is_sent_again_under_the_same_key(
    pipeline_with_reconciler: Pipeline,
) -> None:
    pipeline = pipeline_with_reconciler
    faults(pipeline, down=True)  # the connection drops: the executor cannot know
    command = refund_command(f"never-{uuid.uuid4().hex[:10]}")
    publish_commands(pipeline.settings, [command])
    outcomes_until(pipeline, command.call_id, {"unknown"})
    assert command.operation_id not in provider_stats(pipeline.provider_url)["by_key"]
    faults(pipeline)  # the provider is back
    seen = outcomes_until(pipeline, command.call_id, {"succeeded"})
    assert seen[-1]["stage"] == "reconcile"
    assert provider_stats(pipeline.provider_url)["by_key"][command.operation_id] == 1


def test_provider_down_beyond_budget_escalates_then_a_human_resolves(
    pipeline_with_reconciler: Pipeline,
) -> None:
    pipeline = pipeline_with_reconciler
    # Applied, response lost, and the provider down from that moment: a check made before
    # this test's next request would otherwise find the refund and settle it.
    faults(pipeline, drop_after=1, then_down=True)
    command = refund_command(f"esc-{uuid.uuid4().hex[:10]}", amount=7)
    publish_commands(pipeline.settings, [command])
    outcomes_until(pipeline, command.call_id, {"unknown"})
    # Escalated (v1.9): still `unknown`, since nobody can tell whether the effect happened
    # (it did); the final answer is the human's.
    seen = outcomes_until(pipeline, command.call_id, {"unknown"}, code="retry_exhausted")
    assert (seen[-1]["status"], seen[-1]["stage"]) == ("unknown", "reconcile")
    state = ledger(pipeline, command.operation_id)
    assert (state["status"], state["escalated"], state["attempts"]) == ("unknown", True, 4)
    assert refund_status(pipeline, command.operation_id) == "pending"  # reservation kept

    env = {**os.environ, **pipeline.env}
    listed = subprocess.run(
        [sys.executable, "-m", "ratifier.cli", "ops", "unknown"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert command.operation_id in listed.stdout and "ESCALATED" in listed.stdout
    # … and why it waits: the last check's result, what comes next, who waits.
    assert "last check: cannot tell: " in listed.stdout
    assert "next check: none: waits for `ratifier ops resolve`" in listed.stdout
    assert f"waiting calls (1): {command.call_id}" in listed.stdout

    def resolve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ratifier.cli", "ops", "resolve", command.operation_id, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    # Only an operator of the operation's tenant may settle it, and says who they are with
    # a verified token, not a name: anything else changes nothing.
    settings = pipeline.settings
    named = resolve("--applied", "--by", "ops-oncall")
    assert named.returncode == 2 and "--by is gone" in named.stderr, named
    approver = context_token(settings, "tenant-a", "ops-oncall", ("approver",))
    refused = resolve("--applied", "--token", approver)
    assert refused.returncode == 2 and "may not resolve" in refused.stderr, refused
    foreign = context_token(settings, "tenant-b", "ops-oncall", ("operator",))
    assert resolve("--applied", "--token", foreign).returncode == 2
    assert ledger(pipeline, command.operation_id)["status"] == "unknown"
    operator = context_token(settings, "tenant-a", "ops-oncall", ("operator",))
    resolved = resolve("--applied", "--reference", "prv_checked_by_hand", "--token", operator)
    assert resolved.returncode == 0, resolved.stderr
    seen = outcomes_until(pipeline, command.call_id, {"succeeded"})
    assert seen[-1]["result"]["provider_ref"] == "prv_checked_by_hand"
    # One final answer, the right one: the applied refund was never reported `failed`.
    assert [o["status"] for o in seen if o["status"] != "unknown"] == ["succeeded"], seen
    assert refund_status(pipeline, command.operation_id) == "succeeded"
    again = resolve("--not-applied", "--token", operator)
    assert again.returncode == 1  # settled once: nothing left to resolve
    assert provider_stats(pipeline.provider_url)["by_key"][command.operation_id] == 1
    # The audit names the operator as their token did: sub, tenant and roles.
    with psycopg.connect(settings.storage.database_url) as conn:
        (detail,) = conn.execute(
            "SELECT detail FROM audit_log WHERE tenant = 'tenant-a' AND call_id = %s"
            " AND kind = 'resolved_by_human'",
            (command.call_id,),
        ).fetchone() or (None,)
    assert detail is not None
    assert (detail["by"], detail["by_tenant"], detail["by_roles"]) == (
        "ops-oncall",
        "tenant-a",
        ["operator"],
    ), detail
    assert detail["applied"] is True and detail["reference"] == "prv_checked_by_hand"


def test_reconciler_killed_mid_schedule_neither_loses_nor_repeats(
    pipeline_with_reconciler: Pipeline,
) -> None:
    pipeline = pipeline_with_reconciler
    pipeline.stop_worker("reconciler")
    patient = pipeline.start(
        "reconciler",
        "reconciler-patient",
        RATIFIER_RECONCILER__BACKOFF_SECONDS="0.2",
        RATIFIER_RECONCILER__ATTEMPTS="60",
    )
    faults(pipeline, drop_after=1, then_down=True)  # applied, answer lost, provider down
    command = refund_command(f"kill-{uuid.uuid4().hex[:10]}")
    publish_commands(pipeline.settings, [command])
    outcomes_until(pipeline, command.call_id, {"unknown"})
    deadline = time.monotonic() + 60
    while ledger(pipeline, command.operation_id)["attempts"] < 2:
        assert time.monotonic() < deadline, (
            f"the schedule never ran: {ledger(pipeline, command.operation_id)}, "
            f"{due_elsewhere(pipeline)} other unknown operation(s) not escalated\n"
            f"{patient.log_tail()}"
        )
        time.sleep(0.2)
    patient.kill()
    before = ledger(pipeline, command.operation_id)["attempts"]
    pipeline.workers.remove(patient)
    pipeline.start(
        "reconciler",
        "reconciler-restarted",
        RATIFIER_RECONCILER__BACKOFF_SECONDS="0.2",
        RATIFIER_RECONCILER__ATTEMPTS="60",
    )
    while ledger(pipeline, command.operation_id)["attempts"] <= before:
        assert time.monotonic() < deadline + 60, "the schedule was lost"
        time.sleep(0.2)
    faults(pipeline)
    seen = outcomes_until(pipeline, command.call_id, {"succeeded"})
    assert [o["status"] for o in seen] == ["unknown", "succeeded"]
    assert provider_stats(pipeline.provider_url)["by_key"][command.operation_id] == 1
    assert ledger(pipeline, command.operation_id)["attempts"] > before
