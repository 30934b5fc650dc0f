from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ratifier.migrate import migrate
from ratifier.processes import WorkerProcess, start_worker
from ratifier.topics import delete_topics, ensure_topics
from schemas.names import Topic
from schemas.settings import Settings
from tests.services import (
    outcomes_by_call,
    proposal,
    publish,
    read_until,
    run,
    session_settings,
    worker_env,
)

ARTIFACTS = Path(os.environ.get("RATIFIER_TEST_ARTIFACTS", "test-artifacts"))


@dataclass
class Pipeline:
    settings: Settings
    workers: list[WorkerProcess]

    def alive(self) -> bool:
        return all(w.process.poll() is None for w in self.workers)


@pytest.fixture(scope="session")
def pipeline() -> Iterator[Pipeline]:
    """One streams worker and one executor on this session's own topics."""
    settings = session_settings()
    migrate(settings.database_url)
    run(ensure_topics(settings))
    env = worker_env(settings)
    log_dir = ARTIFACTS / "e2e-logs"
    workers = [
        start_worker("streams", name="streams", log_dir=log_dir, env=env),
        start_worker("executor", name="executor", log_dir=log_dir, env=env),
    ]
    try:
        # Ready when a call makes it all the way through (consumer groups joined).
        warm = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
        run(publish(settings, [(warm["call_id"], json.dumps(warm).encode())]))
        run(
            read_until(
                settings,
                [Topic.OUTCOMES],
                lambda recs: warm["call_id"] in outcomes_by_call(recs),
                timeout=120,
            )
        )
        yield Pipeline(settings=settings, workers=workers)
    except TimeoutError:
        tails = "\n".join(f"--- {w.name}\n{w.log_tail()}" for w in workers)
        raise RuntimeError(f"pipeline did not become ready:\n{tails}") from None
    finally:
        for worker in workers:
            worker.stop()
        run(delete_topics(settings))
