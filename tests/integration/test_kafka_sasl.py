"""A private broker with a SASL_SSL listener (SCRAM-SHA-512, certificates from a CA that
`deploy/local/kafka-cluster` generates at `up`): the right credentials and CA produce and
consume; a wrong password and an untrusted CA are refused with errors that say why."""

from __future__ import annotations

import logging
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed
from aiokafka.helpers import create_ssl_context

from tests.kafka_instances import REPO, KafkaInstance

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(240)]

USER = "ratifier"
PASSWORD = "ratifier-local-secret"  # the script's local default, not a secret


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[KafkaInstance]:
    instance = KafkaInstance(name=f"sasl-{uuid.uuid4().hex[:6]}", brokers=1, sasl=True)
    try:
        instance.up()
        yield instance
    finally:
        instance.down()


def client_options(broker: KafkaInstance, password: str = PASSWORD) -> dict[str, Any]:
    """What ratifier's clients will need (docs/operations.md, "SASL_SSL")."""
    return {
        "bootstrap_servers": broker.bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": USER,
        "sasl_plain_password": password,
        "ssl_context": create_ssl_context(cafile=str(broker.ca_file)),
    }


async def test_right_credentials_produce_and_consume(sasl_broker: KafkaInstance) -> None:
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**client_options(sasl_broker))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name=topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**client_options(sasl_broker), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for n in range(50):
            await producer.send(topic, key=f"k{n}".encode(), value=f"v{n}".encode())
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, **client_options(sasl_broker), group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    seen: list[bytes] = []
    try:
        while len(seen) < 50:
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, f"no records within 10 s; saw {len(seen)}"
            seen.extend(r.value for batch in batches.values() for r in batch)
    finally:
        await consumer.stop()
    assert sorted(seen) == sorted(f"v{n}".encode() for n in range(50))


async def test_wrong_password_is_refused_with_a_clear_error(
    sasl_broker: KafkaInstance, caplog: pytest.LogCaptureFixture
) -> None:
    port = sasl_broker.port(1)
    context = create_ssl_context(cafile=str(sasl_broker.ca_file))
    # One connection: the broker's own answer.
    with pytest.raises(SaslAuthenticationFailed) as refused:
        await create_conn(
            "127.0.0.1",
            port,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=USER,
            sasl_plain_password="not-the-password",
            ssl_context=context,
        )
    assert "invalid credentials" in str(refused.value)
    assert "SCRAM-SHA-512" in str(refused.value)
    # A producer: start fails, and the log says why.
    producer = AIOKafkaProducer(**client_options(sasl_broker, password="not-the-password"))
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert any("invalid credentials" in r.getMessage() for r in caplog.records), caplog.text


async def test_untrusted_certificate_and_plaintext_are_refused(sasl_broker: KafkaInstance) -> None:
    port = sasl_broker.port(1)
    # The system CAs do not know the local CA: the TLS handshake fails before any password.
    with pytest.raises(ssl.SSLCertVerificationError):
        await create_conn(
            "127.0.0.1",
            port,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=USER,
            sasl_plain_password=PASSWORD,
            ssl_context=create_ssl_context(),
        )
    # There is no plaintext listener: a PLAINTEXT client cannot even bootstrap.
    producer = AIOKafkaProducer(bootstrap_servers=sasl_broker.bootstrap, request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()


def test_status_lists_the_private_instance_next_to_the_shared_services(
    sasl_broker: KafkaInstance,
) -> None:
    """`deploy/local/status` under the instance's state directory: the shared services are
    reported as reused (never owned), and the instance's node as up, on its own port."""
    done = subprocess.run(
        [REPO / "deploy" / "local" / "status"],
        env=sasl_broker.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "not started by up" in lines["kafka"]  # the shared broker, not this home's
    node = lines["kafka-1"]
    assert " up " in node and f"127.0.0.1:{sasl_broker.port(1)}" in node and "SASL_SSL" in node
    assert f"pid {sasl_broker.pid(1)}" in node
