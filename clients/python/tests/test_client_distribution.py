"""The agent-side distribution's own tests: they run in a virtualenv holding ratifier-client
and its test extras only (`make client`), so each also proves the piece needs no server."""

from __future__ import annotations

import importlib
import sys

import jwt
import pytest
from aiokafka.partitioner import murmur2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ratifier_client import ClientSettings, RatifierClient, idempotency_key_for
from ratifier_client.proofs import CALL_PROOF_TYPE, call_proof_claims, sign_call_proof
from schemas.envelopes import Outcome, ProposedCall

SERVER_PACKAGES = (
    "runtime", "commands", "streams", "executors", "approvals", "audit", "dashboard",
    "telemetry", "ratifier", "faust", "psycopg", "redis", "cedarpy", "pydantic_settings",
)  # fmt: skip


def test_importing_the_client_loads_nothing_of_the_server() -> None:
    importlib.import_module("ratifier_client.client")
    importlib.import_module("ratifier_client.adapters.confirmation")
    loaded = {name.split(".")[0] for name in sys.modules}
    assert loaded.isdisjoint(SERVER_PACKAGES), loaded & set(SERVER_PACKAGES)


def test_idempotency_keys_are_stable_per_step_and_differ_between_steps() -> None:
    first = idempotency_key_for(agent="support-bot", run="r1", step=3)
    assert first == idempotency_key_for(agent="support-bot", run="r1", step=3)
    assert first != idempotency_key_for(agent="support-bot", run="r1", step=4)
    assert first.startswith("ik-")


def test_settings_come_from_the_services_environment_variables() -> None:
    settings = ClientSettings.from_env(
        {
            "RATIFIER_KAFKA__BOOTSTRAP": "broker-1:9093,broker-2:9093",
            "RATIFIER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "RATIFIER_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
            "RATIFIER_KAFKA__SASL_USERNAME": "agent",
            "RATIFIER_KAFKA__SASL_PASSWORD": "s3cret",
            "RATIFIER_TOPIC_PREFIX": "tenant-a.",
            "RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES": "2097152",
            "RATIFIER_STORAGE__DATABASE_URL": "postgresql://not-an-agent-setting",
        }
    )
    assert settings.kafka.bootstrap == "broker-1:9093,broker-2:9093"
    assert settings.kafka.uses_tls
    assert settings.kafka.uses_sasl
    assert settings.topic_prefix == "tenant-a."
    assert settings.limits.kafka_max_message_bytes == 2_097_152
    assert "s3cret" not in repr(settings)


def test_the_legacy_bootstrap_variable_yields_to_the_nested_one() -> None:
    assert ClientSettings.from_env({"RATIFIER_KAFKA_BOOTSTRAP": "old:9092"}).kafka.bootstrap == (
        "old:9092"
    )
    both = {"RATIFIER_KAFKA_BOOTSTRAP": "old:9092", "RATIFIER_KAFKA__BOOTSTRAP": "new:9092"}
    assert ClientSettings.from_env(both).kafka.bootstrap == "new:9092"


def test_inconsistent_security_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="needs sasl_mechanism"):
        ClientSettings.from_env({"RATIFIER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"})


def test_a_client_built_from_settings_takes_their_broker_prefix_and_record_size() -> None:
    settings = ClientSettings.from_env(
        {"RATIFIER_KAFKA__BOOTSTRAP": "b:9092", "RATIFIER_TOPIC_PREFIX": "p."}
    )
    # A reply topic must lie under the prefix's reply namespace.
    RatifierClient.from_settings(settings, reply_topic="p.replies.shared", reply_partition=2)
    with pytest.raises(ValueError, match=r"reply topic must start with p\.replies\."):
        RatifierClient.from_settings(settings, reply_topic="outcomes")


def test_a_call_proof_signs_the_call_and_the_token_it_is_made_with() -> None:
    key = Ed25519PrivateKey.generate()
    proof = sign_call_proof(
        key, call_id="c-1", idempotency_key="ik-1", tool="get_payment",
        arguments={"payment_id": "pay_1"}, context="token-1", now=1_700_000_000,
    )  # fmt: skip
    header = jwt.get_unverified_header(proof)
    assert header["typ"] == CALL_PROOF_TYPE
    claims = jwt.decode(proof, key.public_key(), algorithms=["EdDSA"])
    expected = call_proof_claims(
        call_id="c-1", idempotency_key="ik-1", tool="get_payment",
        arguments={"payment_id": "pay_1"}, context="token-1",
    )  # fmt: skip
    assert {k: claims[k] for k in expected} == expected
    other = call_proof_claims(
        call_id="c-1", idempotency_key="ik-1", tool="get_payment",
        arguments={"payment_id": "pay_2"}, context="token-1",
    )  # fmt: skip
    assert other["arguments_sha256"] != expected["arguments_sha256"]


def test_the_contract_models_travel_with_the_client() -> None:
    call = ProposedCall.model_validate(
        {
            "call_id": "c-1",
            "idempotency_key": "ik-1",
            "tool": "get_payment",
            "arguments": {"payment_id": "pay_1"},
            "context": "token",
            "proposed_at": "2026-01-01T00:00:00Z",
        }
    )
    assert call.tool == "get_payment"
    assert "status" in Outcome.model_fields
    # The partitioner the client mints home-partition call ids with is aiokafka's murmur2.
    assert murmur2(b"c-1") == murmur2(b"c-1")
