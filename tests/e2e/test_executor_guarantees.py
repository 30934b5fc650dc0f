"""At most once in effect, measured at the payment provider: many executors, duplicates and
conflicting reuses, kill -9 at every point of the execution, Redis flushed and restarted."""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schemas.envelopes import CommittedCommand
from tests.e2e.conftest import Pipeline, SigningKeys
from tests.e2e.executor_kit import (
    distinct_statuses,
    executor_pipeline,
    provider_stats,
    publish_commands,
    reconciled_history,
    refund_command,
    wait_terminal,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def executors_only(signing_keys: SigningKeys, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    with executor_pipeline(signing_keys, "executors", getattr(request, "param", 3)) as pipeline:
        yield pipeline


def test_three_executors_duplicates_and_conflicts(executors_only: Pipeline) -> None:
    pipeline = executors_only
    unique = [refund_command(f"u-{uuid.uuid4().hex[:12]}") for _ in range(2000)]
    rng = random.Random(7)
    exact = [c for c in rng.sample(unique, 100)]  # redelivered records (same call)
    retries = [
        c.model_copy(update={"call_id": f"r-{uuid.uuid4().hex[:12]}"})
        for c in rng.sample(unique, 100)
    ]  # the agent retried with the same key
    conflicting = [
        refund_command(c.idempotency_key, amount=2, payment=c.arguments["payment_id"])
        for c in rng.sample(unique, 20)
    ]  # same key reused for other arguments
    publish_commands(pipeline.settings, unique + exact + retries + conflicting)
    calls = {c.call_id for c in unique + retries + conflicting}
    outcomes = wait_terminal(pipeline.settings, calls, timeout=240)

    stats = provider_stats(pipeline.provider_url)
    assert stats["refunds"] == len(unique)
    assert set(stats["by_key"].values()) == {1}
    assert set(stats["by_key"]) == {c.operation_id for c in unique}
    for c in unique + retries:
        assert distinct_statuses(outcomes[c.call_id]) == {"succeeded"}, outcomes[c.call_id]
    for c in conflicting:
        assert distinct_statuses(outcomes[c.call_id]) == {"conflict"}
    # A retry gets the stored outcome of its operation: same refund, same provider reference.
    first = {c.operation_id: outcomes[c.call_id][0]["result"] for c in unique}
    assert all(outcomes[c.call_id][0]["result"] == first[c.operation_id] for c in retries)


@pytest.mark.parametrize("executors_only", [0], indirect=True)
@pytest.mark.parametrize(
    "point",
    [
        "group_prepared",
        "group_committed",
        "before_effect",
        "after_effect",
        "after_ledger",
        "after_publish",
    ],
)
def test_kill_minus_nine_at_each_point(executors_only: Pipeline, point: str) -> None:
    pipeline = executors_only
    # Per command for before_effect, after_effect and after_ledger; at the first group (a
    # partition batch's writes) or the first batch for the others.
    rate = "0.1" if point in ("before_effect", "after_effect", "after_ledger") else "1"
    crashing = pipeline.start_crashing("executor", "executor-crashing", at=f"{point}:{rate}")
    commands = [refund_command(f"k-{uuid.uuid4().hex[:12]}") for _ in range(60)]
    publish_commands(pipeline.settings, commands)
    deadline = time.monotonic() + 60
    while crashing.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert crashing.process.poll() == -9, f"no crash at {point}:\n{crashing.log_tail()}"
    pipeline.start("executor", "executor-after-crash")

    outcomes = wait_terminal(pipeline.settings, {c.call_id for c in commands}, timeout=120)
    stats = provider_stats(pipeline.provider_url)
    assert set(stats["by_key"].values()) <= {1}, "a duplicate effect"
    statuses = {c.call_id: distinct_statuses(outcomes[c.call_id]) for c in commands}
    assert all(len(s) == 1 for s in statuses.values()), statuses
    ended = {next(iter(s)) for s in statuses.values()}
    # Partitions run concurrently: commands of other partitions may be between their first
    # transaction and their effect when the process dies; they may have acted, so they end
    # unknown (for reconciliation) and are never re-run. After publishing, all is done.
    assert ended <= {"succeeded", "unknown"}
    if point in ("group_committed", "before_effect", "after_effect"):
        # The killed group was committed as effect_pending: it may have acted.
        assert "unknown" in ended
    if point == "after_publish":
        assert ended == {"succeeded"}
    succeeded = {c.operation_id for c in commands if statuses[c.call_id] == {"succeeded"}}
    assert succeeded <= set(stats["by_key"])

    # Reconciliation settles what the crash left unknown; then the whole history must hold.
    history = reconciled_history(pipeline, commands, seconds=90, wait_seconds=60)
    assert history.problems(settled=True) == []


def flush_and_restart(
    pipeline: Pipeline, client: redis.Redis
) -> tuple[list[CommittedCommand], list[CommittedCommand]]:
    """Flush Redis mid-run, then restart it; returns the commands sent before and after the
    flush."""
    first = [refund_command(f"f-{uuid.uuid4().hex[:12]}") for _ in range(300)]
    publish_commands(pipeline.settings, first)
    wait_terminal(pipeline.settings, {c.call_id for c in first[:50]}, timeout=120)
    client.flushall()
    # After the flush the fast path knows nothing: every duplicate is the ledger's to answer.
    again = [c.model_copy(update={"call_id": f"a-{uuid.uuid4().hex[:12]}"}) for c in first]
    publish_commands(pipeline.settings, again)
    with contextlib.suppress(redis.ConnectionError):  # the server hangs up as it goes
        client.shutdown(nosave=True)
    restarted = subprocess.run(
        [REPO / "deploy/local/up"], capture_output=True, text=True, timeout=120, check=False
    )
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    return first, again


@pytest.mark.parametrize("executors_only", [2], indirect=True)
def test_redis_flushed_and_restarted_mid_run(executors_only: Pipeline) -> None:
    pipeline = executors_only
    with contextlib.closing(redis.Redis.from_url(pipeline.settings.storage.redis_url)) as client:
        first, again = flush_and_restart(pipeline, client)
    more = [c.model_copy(update={"call_id": f"m-{uuid.uuid4().hex[:12]}"}) for c in first]
    publish_commands(pipeline.settings, more)

    outcomes = wait_terminal(
        pipeline.settings, {c.call_id for c in first + again + more}, timeout=240
    )
    stats = provider_stats(pipeline.provider_url)
    assert stats["by_key"] == {c.operation_id: 1 for c in first}
    odd = {
        c: distinct_statuses(o)
        for c, o in outcomes.items()
        if distinct_statuses(o) != {"succeeded"}
    }
    assert odd == {}
