"""The pipeline through a SASL_SSL broker (a private instance of deploy/local/kafka-cluster:
SCRAM-SHA-512 over TLS with a CA generated at `up`, no plaintext listener): the worker
processes take the connection from `RATIFIER_KAFKA__*` only, a call goes validate →
authorize → execute to `succeeded`, and a worker given a wrong password stops at start
with an error that names the authentication failure."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from config.settings import Settings
from ratifier.processes import start_worker
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.kafka_instances import KafkaInstance
from tests.services import json_body, proposal, publish, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(300)]

USER = "ratifier"
PASSWORD = "ratifier-local-secret"  # deploy/local/kafka-cluster's local default, not a secret
# A read's records: the authorizer commits it with no `calls.authorized` record (v1.8).
STAGE_TOPICS = [Topic.PROPOSED, Topic.VALIDATED, Topic.COMMITTED, Topic.OUTCOMES]


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[KafkaInstance]:
    instance = KafkaInstance(name=f"sasl-e2e-{uuid.uuid4().hex[:6]}", brokers=1, sasl=True)
    try:
        instance.up()
        yield instance
    finally:
        instance.down()


def sasl_env(broker: KafkaInstance, password: str = PASSWORD) -> dict[str, str]:
    return {
        "RATIFIER_KAFKA__BOOTSTRAP": broker.bootstrap,
        "RATIFIER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "RATIFIER_KAFKA__SSL_CAFILE": str(broker.ca_file),
        "RATIFIER_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "RATIFIER_KAFKA__SASL_USERNAME": USER,
        "RATIFIER_KAFKA__SASL_PASSWORD": password,
    }


@pytest.fixture(scope="module")
def sasl_pipeline(sasl_broker: KafkaInstance, signing_keys: SigningKeys) -> Iterator[Pipeline]:
    with pytest.MonkeyPatch.context() as patch:
        # The test's own clients (topics, publish, read) and the workers read the same
        # variables; the legacy plaintext bootstrap is left unset.
        patch.delenv("RATIFIER_KAFKA_BOOTSTRAP", raising=False)
        for name, value in sasl_env(sasl_broker).items():
            patch.setenv(name, value)
        pipeline = start_pipeline(signing_keys, f"sasl-{uuid.uuid4().hex[:4]}")
    try:
        yield pipeline
    finally:
        pipeline.stop()


def test_a_call_goes_through_every_stage_over_sasl_ssl(
    sasl_pipeline: Pipeline, sasl_broker: KafkaInstance
) -> None:
    settings = sasl_pipeline.settings
    assert settings.kafka.bootstrap == sasl_broker.bootstrap
    assert settings.kafka.security_protocol == "SASL_SSL"
    call = proposal(settings, tool="get_payment", arguments={"payment_id": "pay_A1001"})
    started = time.monotonic()
    run(publish(settings, [(call["call_id"], json.dumps(call).encode())]))

    def mine(records: list[Any]) -> dict[str, list[dict[str, Any]]]:
        seen: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            body = json_body(record)
            if body is not None and body.get("call_id") == call["call_id"]:
                seen.setdefault(record.topic.removeprefix(settings.topic_prefix), []).append(body)
        return seen

    records = run(
        read_until(
            settings,
            STAGE_TOPICS,
            lambda recs: any(
                o["status"] == "succeeded" for o in mine(recs).get(Topic.OUTCOMES.value, [])
            ),
            timeout=60,
        )
    )
    seen = mine(records)
    assert set(seen) == {t.value for t in STAGE_TOPICS}, sorted(seen)
    (outcome,) = [o for o in seen[Topic.OUTCOMES.value] if o["status"] == "succeeded"]
    assert outcome["stage"] == "execute"
    assert outcome["result"]["id"] == "pay_A1001"
    assert seen[Topic.COMMITTED.value][0]["operation_id"] == f"tenant-a:{call['call_id']}"
    print(f"\nthrough SASL_SSL in {time.monotonic() - started:.2f}s")
    assert sasl_pipeline.alive()


@pytest.mark.parametrize("command", ["executor", "streams"])
def test_a_worker_with_a_wrong_password_stops_with_an_authentication_error(
    sasl_pipeline: Pipeline, sasl_broker: KafkaInstance, command: str
) -> None:
    env = {**sasl_pipeline.env, **sasl_env(sasl_broker, password="not-the-password")}
    worker = start_worker(
        command, name=f"{command}-wrong-password", log_dir=sasl_pipeline.log_dir, env=env
    )
    try:
        worker.process.wait(timeout=60)
    finally:
        code = worker.stop()
    log = worker.log_tail(200)
    assert code == 2, log
    # `ratifier streams` launches `stages` and `approval-join`: the one that met the broker first
    # says so under its own name.
    names = ("stages", "approval-join") if command == "streams" else (command,)
    failed = [
        f"ratifier {n}: Kafka authentication failed at {sasl_broker.bootstrap}" for n in names
    ]
    assert any(line in log for line in failed), log
    assert "SCRAM-SHA-512 as 'ratifier'" in log and "invalid credentials" in log, log
    assert "not-the-password" not in log


def test_settings_keep_the_password_out_of_their_repr(sasl_broker: KafkaInstance) -> None:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in sasl_env(sasl_broker).items():
            patch.setenv(name, value)
        settings = Settings()
    assert settings.kafka.sasl_password is not None
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.kafka)
