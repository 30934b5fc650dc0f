"""Helpers for the executor e2e tests: committed refund commands straight onto
`commands.committed`, provider statistics, outcome bookkeeping."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from approvals.signing import approval_keys
from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from config.settings import Settings
from ratifier.topics import delete_topics
from schemas.envelopes import CommittedCommand, Effect
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.e2e.history import History
from tests.services import outcomes_by_call, publish, read_until, run
from testsupport.records import approved_command

POLICIES = PolicySet.from_directory()
PAYMENTS = [f"pay_T{n}" for n in range(20)]
# Receipts are signed with the local deployment's approval key (the executor verifies them).
RECEIPT_KEYS = approval_keys(Settings())


def seed_payments(settings: Settings) -> None:
    """Payments with room for thousands of refunds (the test database only)."""
    with psycopg.connect(settings.storage.database_url) as conn:
        for payment in PAYMENTS:
            conn.execute(
                "INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, "
                "currency, refundable_minor, status) VALUES ('tenant-a', %s, 'load@example.com',"
                " 1000000000000, 'EUR', 1000000000000, 'captured') ON CONFLICT (tenant, "
                "payment_id) DO UPDATE SET refundable_minor = EXCLUDED.refundable_minor",
                (payment,),
            )


def refund_command(
    key: str, amount: int = 1, call_id: str | None = None, payment: str | None = None
) -> CommittedCommand:
    arguments = {
        "payment_id": payment or PAYMENTS[hash(key) % len(PAYMENTS)],
        "amount_minor": amount,
        "reason": "load test",
    }
    return approved_command(
        "propose_refund",
        arguments,
        key=key,
        call_id=call_id or f"x-{uuid.uuid4().hex[:16]}",
        effect=Effect.EXTERNAL_WRITE,
        policy_version=POLICIES.version,
        keys=RECEIPT_KEYS,
        now=datetime.now(UTC),
        validity=timedelta(minutes=30),
    )


def publish_commands(settings: Settings, commands: list[CommittedCommand]) -> None:
    run(publish(settings, [(c.operation_id, c.to_bytes()) for c in commands], Topic.COMMITTED))


def wait_terminal(
    settings: Settings, call_ids: set[str], timeout: float = 120
) -> dict[str, list[dict[str, Any]]]:
    """Every call's outcomes once each call has at least one terminal outcome."""
    records = run(
        read_until(
            settings,
            [Topic.OUTCOMES],
            lambda recs: call_ids <= set(outcomes_by_call(recs)),
            timeout=timeout,
        )
    )
    found = outcomes_by_call(records)
    return {c: found[c] for c in call_ids}


@contextmanager
def executor_pipeline(
    keys: SigningKeys, name: str, executors: int, policies: Path = DEFAULT_POLICY_DIR
) -> Iterator[Pipeline]:
    """A provider and ``executors`` executors (claim lease 5 s, the policy folder
    ``policies``) on topics of their own, no streams worker, the payments seeded; stopped and
    the topics deleted afterwards."""
    pipeline = start_pipeline(
        keys,
        f"{name}-{uuid.uuid4().hex[:4]}",
        streams=False,
        executors=executors,
        RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS="5",
        RATIFIER_POLICIES__DIRECTORY=str(policies),
    )
    seed_payments(pipeline.settings)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def reconciled_history(
    pipeline: Pipeline, commands: list[CommittedCommand], *, seconds: float, wait_seconds: float
) -> History:
    """Start a reconciler (checking every 0.2 s) on ``pipeline``; the history of ``commands``
    once it holds with every unknown settled, else as it is after ``seconds``."""
    pipeline.start("reconciler", "reconciler", RATIFIER_RECONCILER__BACKOFF_SECONDS="0.2")
    history = History(proposed={c.call_id: c.operation_id for c in commands})
    deadline = time.monotonic() + seconds
    while True:
        history.outcomes = wait_terminal(
            pipeline.settings, set(history.proposed), timeout=wait_seconds
        )
        history.effects = provider_stats(pipeline.provider_url)["by_key"]
        if not history.problems(settled=True) or time.monotonic() > deadline:
            return history
        time.sleep(1)


def provider_stats(provider_url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{provider_url}/_stats", timeout=10) as response:
        stats: dict[str, Any] = json.loads(response.read())
        return stats


def distinct_statuses(outcomes: list[dict[str, Any]]) -> set[str]:
    return {o["status"] for o in outcomes}
