"""`/healthz` and `/readyz` of running workers (runtime/health.py): the executor and the
streams worker are alive and become ready once they joined their groups; an executor whose
broker cannot be reached is alive and not ready, and says why; a worker in the service shell
(runtime/shell.py) started while its broker (the stages) or its database (the reconciler) is
unreachable waits, not ready, then serves."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from ratifier.topics import delete_topics
from tests.e2e.conftest import Pipeline, SigningKeys, free_port, start_pipeline
from tests.e2e.private_services import Forwarder
from tests.services import run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def probe(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_probe(
    url: str, ok: Callable[[int, dict[str, Any]], bool], alive: Callable[[], bool], timeout: float
) -> tuple[int, dict[str, Any]]:
    """The first answer of ``url`` that ``ok`` accepts (connection errors: not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        assert alive(), f"the worker exited; last answer {last}"
        try:
            answer = probe(url)
            last = answer
            if ok(*answer):
                return answer
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise TimeoutError(f"{url}: no accepted answer in {timeout}s; last {last}")


@pytest.fixture(scope="module")
def probed(signing_keys: SigningKeys) -> Iterator[tuple[Pipeline, int]]:
    executor_port = free_port()
    pipeline = start_pipeline(
        signing_keys,
        f"health-{uuid.uuid4().hex[:4]}",
        RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT=str(executor_port),
    )
    try:
        yield pipeline, executor_port
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def test_executor_and_streams_worker_are_alive_and_ready(probed: tuple[Pipeline, int]) -> None:
    pipeline, executor_port = probed
    for name, service, base in (
        ("executor", "executor", f"http://127.0.0.1:{executor_port}"),
        # `ratifier streams` runs `stages` (which serves this port) and `approval-join`.
        ("streams", "stages", f"http://127.0.0.1:{pipeline.http_port}"),
    ):
        worker = pipeline.worker(name)

        def running(worker: Any = worker) -> bool:
            return worker.process.poll() is None

        status, alive = probe(f"{base}/healthz")
        assert status == 200 and alive["alive"] is True and alive["service"] == service, alive
        status, ready = wait_probe(
            f"{base}/readyz", lambda status, _body: status == 200, running, timeout=60
        )
        assert ready["ready"] is True and ready["why"] is None, ready
        # The pipeline's topics have 4 partitions; this worker is the only member.
        assert ready["partitions"] >= 4, ready
        assert ready["lag"] is None or ready["lag"] <= ready["max_lag"], ready
    with urllib.request.urlopen(f"http://127.0.0.1:{executor_port}/metrics", timeout=3) as got:
        assert b"ratifier_consumer_lag" in got.read()


def test_an_executor_without_a_broker_is_alive_and_not_ready(
    probed: tuple[Pipeline, int],
) -> None:
    pipeline, _ = probed
    port = free_port()
    worker = pipeline.start(
        "executor",
        "executor-no-broker",
        RATIFIER_KAFKA__BOOTSTRAP="127.0.0.1:1",  # nothing listens there
        RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT=str(port),
    )
    base = f"http://127.0.0.1:{port}"

    def running() -> bool:
        return worker.process.poll() is None

    status, ready = wait_probe(
        f"{base}/readyz",
        lambda _status, body: str(body.get("why", "")).startswith("kafka:"),
        running,
        timeout=60,
    )
    assert status == 503 and ready["ready"] is False, ready
    assert "127.0.0.1" in ready["why"], ready
    status, alive = probe(f"{base}/healthz")
    assert status == 200 and alive["alive"] is True and alive["phase"] == "starting", alive
    # Still waiting (retrying with backoff), not exited, a few retries later.
    status, ready = wait_probe(
        f"{base}/readyz", lambda _s, body: "kafka:" in str(body.get("why")), running, timeout=10
    )
    assert status == 503 and running()
    assert "Unable to bootstrap" in worker.log_tail(200) or "unavailable" in worker.log_tail(200)


def waits_not_ready_then_serves(
    pipeline: Pipeline, command: str, forwarder: Forwarder, http_port: int, **env: str
) -> str:
    """Start ``command`` with ``env`` pointing a dependency at ``forwarder`` (closed yet):
    alive and not ready while its start-up waits for the schema check and topics, ready
    once the forwarder opens; its log."""
    name = f"{command}-late"
    worker = pipeline.start(command, name, **env)
    base = f"http://127.0.0.1:{http_port}"

    def running() -> bool:
        return worker.process.poll() is None

    try:
        status, waiting = wait_probe(
            f"{base}/readyz",
            lambda _status, body: "schema and topics" in str(body.get("why", "")),
            running,
            timeout=60,
        )
        assert status == 503 and waiting["ready"] is False, waiting
        status, alive = probe(f"{base}/healthz")
        assert status == 200 and alive["alive"] is True, alive
        forwarder.start()
        status, ready = wait_probe(
            f"{base}/readyz", lambda status, _body: status == 200, running, timeout=90
        )
        assert ready["ready"] is True and ready["partitions"] >= 1, ready
        return worker.log_tail(400)
    finally:
        pipeline.stop_worker(name)
        forwarder.close()


def test_a_stages_worker_started_while_the_broker_is_unreachable_waits_then_serves(
    probed: tuple[Pipeline, int],
) -> None:
    pipeline, _ = probed
    host, _, port = pipeline.settings.kafka_bootstrap.partition(":")
    broker_port, http_port = free_port(), free_port()
    log = waits_not_ready_then_serves(
        pipeline,
        "stages",
        Forwarder(broker_port, (host, int(port))),
        http_port,
        RATIFIER_KAFKA__BOOTSTRAP=f"127.0.0.1:{broker_port}",  # nothing listens there yet
        RATIFIER_STREAMS__HTTP_PORT=str(http_port),
    )
    assert "stages waits for schema and topics" in log


def test_a_reconciler_started_while_postgres_is_unreachable_is_not_ready_then_ready(
    probed: tuple[Pipeline, int],
) -> None:
    pipeline, _ = probed
    database = urlsplit(pipeline.settings.storage.database_url)
    database_port, http_port = free_port(), free_port()
    credentials = database.netloc.rpartition("@")[0]
    unreachable = database._replace(netloc=f"{credentials}@127.0.0.1:{database_port}").geturl()
    log = waits_not_ready_then_serves(
        pipeline,
        "reconciler",
        Forwarder(database_port, (database.hostname or "127.0.0.1", database.port or 5432)),
        http_port,
        RATIFIER_STORAGE__DATABASE_URL=unreachable,  # nothing listens there yet
        RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT=str(http_port),
    )
    assert "reconciler waits for schema and topics" in log
