"""An executor whose policy follower dies stops, non-zero, with the reason in its log,
instead of serving on a frozen policy view (runtime/supervision.py). The follower is made to
raise by a crash point in raise mode (testsupport/crashing.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ratifier.processes import WorkerProcess, wait_for_log
from ratifier.topics import delete_topics
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import run

pytestmark = pytest.mark.e2e


@pytest.fixture
def no_workers(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    """Topics, the database and a provider; no streams worker, no executor."""
    started = start_pipeline(signing_keys, "side-tasks", streams=False, executors=0)
    try:
        yield started
    finally:
        started.stop()
        run(delete_topics(started.settings))


def _exit_code(worker: WorkerProcess, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, f"{worker.name} still running:\n{worker.log_tail()}"
        time.sleep(0.1)
    return worker.process.returncode


def test_an_executor_whose_policy_follower_dies_stops_non_zero(no_workers: Pipeline) -> None:
    executor = no_workers.start_crashing(
        "executor", "executor-follower-dies", at="follower_started:raise"
    )
    assert _exit_code(executor, 90) == 1, executor.log_tail()
    log = executor.log_tail(200)
    assert "crash test: raising at follower_started" in log
    assert (
        "executor stopped: side task policy follower raised InjectedFault: "
        "injected fault at follower_started" in log
    ), log
    assert "Traceback" in log  # the follower's own, logged once where it died


def test_a_healthy_executor_stopped_by_sigterm_exits_zero(no_workers: Pipeline) -> None:
    executor = no_workers.start("executor", "executor-healthy")
    assert wait_for_log(executor, " started on ", 90), executor.log_tail()
    assert executor.stop() == 0, executor.log_tail()
    assert "side task" not in executor.log_tail(200)
