from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from config.settings import Settings
from ratifier.migrate import migrate
from ratifier.processes import (
    FAKE_PROVIDER_MODULE,
    WorkerProcess,
    start_worker,
    start_worker_args,
    wait_for_log,
)
from ratifier.topics import delete_topics, ensure_topics
from schemas.names import Topic
from tests.services import (
    outcomes_by_call,
    proposal,
    publish,
    read_until,
    reset_refundable,
    run,
    session_settings,
    worker_env,
)

ARTIFACTS = Path(os.environ.get("RATIFIER_TEST_ARTIFACTS", "test-artifacts"))


# Runs a ratifier worker with crash points injected (test support, never in production).
CRASHING_MODULE = "testsupport.crashing"


def _ed25519() -> tuple[Ed25519PrivateKey, dict[str, Any]]:
    private = Ed25519PrivateKey.generate()
    return private, json.loads(OKPAlgorithm.to_jwk(private.public_key()))


@dataclass(frozen=True)
class SigningKeys:
    """The agent runtime's keys: two published (a rotation in progress), one retired."""

    current: Ed25519PrivateKey
    next: Ed25519PrivateKey
    retired: Ed25519PrivateKey
    jwks_path: Path


@pytest.fixture(scope="session")
def signing_keys() -> SigningKeys:
    current, current_jwk = _ed25519()
    upcoming, next_jwk = _ed25519()
    retired, _ = _ed25519()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = (ARTIFACTS / "e2e-jwks.json").resolve()
    path.write_text(
        json.dumps(
            {
                "keys": [
                    {**current_jwk, "kid": "runtime-2026-11", "alg": "EdDSA"},
                    {**next_jwk, "kid": "runtime-2026-12", "alg": "EdDSA"},
                ]
            }
        )
    )
    return SigningKeys(current=current, next=upcoming, retired=retired, jwks_path=path)


@dataclass
class Pipeline:
    settings: Settings
    workers: list[WorkerProcess]
    env: dict[str, str]
    log_dir: Path
    http_port: int = 0
    provider_url: str = ""
    # The approval-join's /metrics and health under the `ratifier streams` launcher.
    join_http_port: int = 0

    def alive(self) -> bool:
        return all(w.process.poll() is None for w in self.workers)

    def worker(self, name: str) -> WorkerProcess:
        return next(w for w in self.workers if w.name == name)

    def stop_worker(self, name: str) -> None:
        worker = self.worker(name)
        worker.stop()
        self.workers.remove(worker)

    def start(self, command: str, name: str, **env: str) -> WorkerProcess:
        worker = start_worker(command, name=name, log_dir=self.log_dir, env={**self.env, **env})
        self.workers.append(worker)
        return worker

    def start_crashing(self, command: str, name: str, *, at: str, **env: str) -> WorkerProcess:
        """``ratifier <command>`` that SIGKILLs itself at the crash point ``at``
        (``point:probability``; testsupport/crashing.py)."""
        worker = start_worker_args(
            [at, command],
            name=name,
            log_dir=self.log_dir,
            env={**self.env, **env},
            module=CRASHING_MODULE,
        )
        self.workers.append(worker)
        return worker

    def wait_ready(self, timeout: float = 120) -> None:
        """Ready when a call makes it all the way through (consumer groups joined)."""
        warm = proposal(self.settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
        run(publish(self.settings, [(warm["call_id"], json.dumps(warm).encode())]))
        try:
            run(
                read_until(
                    self.settings,
                    [Topic.OUTCOMES],
                    lambda recs: warm["call_id"] in outcomes_by_call(recs),
                    timeout=timeout,
                )
            )
        except TimeoutError:
            tails = "\n".join(f"--- {w.name}\n{w.log_tail()}" for w in self.workers)
            raise RuntimeError(f"pipeline did not become ready:\n{tails}") from None

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()  # also closes the log of a worker that already exited


def wait_http(url: str, worker: WorkerProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if worker.process.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError(f"{worker.name} did not answer on {url}:\n{worker.log_tail()}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_pipeline(
    keys: SigningKeys,
    name: str,
    *,
    streams: bool = True,
    executors: int = 1,
    approval_ttl: int = 25,
    audit_sink: bool = False,
    kafka_bootstrap: str = "",
    partitions: int | None = None,
    **env: str,
) -> Pipeline:
    """A payment provider, a streams worker and executors on their own topic prefix,
    accepting local HS256 tokens and EdDSA tokens of the published JWKS, with a short approval
    TTL; with ``audit_sink``, also `ratifier audit sink` for that prefix; on the broker at
    ``kafka_bootstrap`` when given; its topics of ``partitions`` partitions when given."""
    settings = session_settings().changed(
        context={"jwks_file": str(keys.jwks_path)}, approvals={"ttl_seconds": approval_ttl}
    )
    if kafka_bootstrap:
        settings = settings.with_kafka(bootstrap=kafka_bootstrap)
    if partitions is not None:  # its topics' partitions (the session's: 4)
        settings = settings.model_copy(update={"topic_partitions": partitions})
    migrate(settings.storage.database_url)
    reset_refundable(settings)
    run(ensure_topics(settings))
    port, provider_port, join_port = free_port(), free_port(), free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    pipeline = Pipeline(
        settings=settings.model_copy(update={"provider_url": provider_url}),
        workers=[],
        env={
            **worker_env(settings),
            "RATIFIER_CONTEXT__JWKS_FILE": str(keys.jwks_path),
            "RATIFIER_APPROVALS__TTL_SECONDS": str(settings.approvals.ttl_seconds),
            "RATIFIER_PROVIDER_URL": provider_url,
            # Several executors per host: metrics ports only where a test asks for them.
            "RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT": "0",
            "RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT": "0",
            "RATIFIER_OBSERVABILITY__AUDIT_METRICS_PORT": "0",
            **env,
        },
        log_dir=ARTIFACTS / f"{name}-logs",
        http_port=port,
        provider_url=provider_url,
        join_http_port=join_port,
    )
    provider = start_worker_args(
        ["--port", str(provider_port)],
        name="provider",
        log_dir=pipeline.log_dir,
        env=pipeline.env,
        module=FAKE_PROVIDER_MODULE,
    )
    pipeline.workers.append(provider)
    try:
        wait_http(provider_url + "/_stats", provider)
        if streams:
            pipeline.start(
                "streams",
                "streams",
                RATIFIER_STREAMS__HTTP_PORT=str(port),
                RATIFIER_STREAMS__JOIN_HTTP_PORT=str(join_port),
            )
        for n in range(executors):
            pipeline.start("executor", "executor" if n == 0 else f"executor-{n}")
        if audit_sink:
            # Reads every topic from the beginning: nothing published before it joins is lost.
            sink = start_worker_args(
                ["audit", "sink"], name="audit-sink", log_dir=pipeline.log_dir, env=pipeline.env
            )
            pipeline.workers.append(sink)
            if not wait_for_log(sink, "audit sink started", timeout=60):
                raise RuntimeError(f"audit sink did not start:\n{sink.log_tail()}")
        if streams:
            pipeline.wait_ready()
    except BaseException:
        pipeline.stop()
        raise
    return pipeline


@pytest.fixture(scope="session")
def pipeline(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    """The session's pipeline, shared by the e2e tests that do not stop workers."""
    started = start_pipeline(signing_keys, "e2e")
    try:
        yield started
    finally:
        started.stop()
        run(delete_topics(started.settings))
