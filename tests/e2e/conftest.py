from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

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

    def alive(self) -> bool:
        return all(w.process.poll() is None for w in self.workers)


@pytest.fixture(scope="session")
def pipeline(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    """One streams worker and one executor on this session's own topics, accepting local
    HS256 tokens and EdDSA tokens of the published JWKS."""
    settings = session_settings().model_copy(
        update={"context_jwks_file": str(signing_keys.jwks_path)}
    )
    migrate(settings.database_url)
    run(ensure_topics(settings))
    env = {**worker_env(settings), "RATIFIER_CONTEXT_JWKS_FILE": str(signing_keys.jwks_path)}
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
