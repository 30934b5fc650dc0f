"""Typed connection settings (Kafka security, Redis ACL/TLS, PostgreSQL sslmode) and how the
client factories apply them: no I/O, the clients are built but never started."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from config.settings import KafkaConnection, Settings
from ratifier_client.client import RatifierClient
from runtime.clients import (
    FileTokenProvider,
    database_conninfo,
    kafka_security,
    redis_options,
    token_provider,
)
from schemas.errors import ConfigurationError

SASL_ENV = {
    "RATIFIER_KAFKA__BOOTSTRAP": "b1:9093,b2:9093",
    "RATIFIER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
    "RATIFIER_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
    "RATIFIER_KAFKA__SASL_USERNAME": "ratifier",
    "RATIFIER_KAFKA__SASL_PASSWORD": "s3cret-password",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("RATIFIER_KAFKA_BOOTSTRAP", *SASL_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_nested_environment_variables_fill_the_kafka_connection(
    clean_env: pytest.MonkeyPatch,
) -> None:
    for name, value in SASL_ENV.items():
        clean_env.setenv(name, value)
    settings = Settings()
    assert settings.kafka.bootstrap == "b1:9093,b2:9093"
    assert settings.kafka_bootstrap == "b1:9093,b2:9093"
    assert settings.kafka.security_protocol == "SASL_SSL"
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "s3cret-password"
    # Never in a repr (logs print settings and clients).
    assert "s3cret-password" not in repr(settings)
    assert "s3cret-password" not in str(settings.kafka)


def test_the_legacy_bootstrap_variable_still_works_and_the_nested_one_wins(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("RATIFIER_KAFKA_BOOTSTRAP", "legacy:9092")
    assert Settings().kafka.bootstrap == "legacy:9092"
    clean_env.setenv("RATIFIER_KAFKA__SECURITY_PROTOCOL", "SSL")
    both = Settings()
    assert (both.kafka.bootstrap, both.kafka.security_protocol) == ("legacy:9092", "SSL")
    clean_env.setenv("RATIFIER_KAFKA__BOOTSTRAP", "nested:9093")
    assert Settings().kafka.bootstrap == "nested:9093"


def test_the_default_is_the_local_plaintext_broker(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.kafka == KafkaConnection()
    assert kafka_security(settings.kafka) == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512"},
            "needs sasl_username and sasl_password",
        ),
        ({"sasl_mechanism": "SCRAM-SHA-512"}, "security_protocol is PLAINTEXT"),
        ({"ssl_cafile": "/ca.pem"}, "TLS files given"),
        (
            {"security_protocol": "SSL", "ssl_keyfile": "/key.pem"},
            "ssl_keyfile needs ssl_certfile",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
            "exactly one of",
        ),
        ({"security_protocol": "TLS"}, "literal_error"),
        ({"sasl_oauth_token_provider": "not a path"}, "string_pattern_mismatch"),
    ],
)
def test_inconsistent_kafka_connections_are_refused(fields: dict[str, str], complaint: str) -> None:
    with pytest.raises(ValidationError) as refused:
        KafkaConnection.model_validate(fields)
    assert complaint in str(refused.value) or complaint in repr(refused.value.errors())


def test_sasl_ssl_options_for_aiokafka(tmp_path: Path) -> None:
    ca = write_self_signed_ca(tmp_path)
    connection = KafkaConnection(
        bootstrap="b1:9093",
        security_protocol="SASL_SSL",
        ssl_cafile=str(ca),
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ratifier",
        sasl_password="s3cret-password",
    )
    options = kafka_security(connection)
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "ratifier"
    assert options["sasl_plain_password"] == "s3cret-password"
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs(), "the CA file was not loaded"


def test_ssl_only_and_oauthbearer(tmp_path: Path) -> None:
    ssl_only = KafkaConnection(security_protocol="SSL", ssl_check_hostname=False)
    options = kafka_security(ssl_only)
    assert options["security_protocol"] == "SSL" and "sasl_mechanism" not in options
    assert options["ssl_context"].check_hostname is False

    token = tmp_path / "token"
    token.write_text("eyJ.token.one\n")
    oauth = KafkaConnection(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_file=str(token),
    )
    options = kafka_security(oauth)
    provider = options["sasl_oauth_token_provider"]
    assert isinstance(provider, FileTokenProvider)
    assert "sasl_plain_password" not in options
    assert asyncio.run(provider.token()) == "eyJ.token.one"
    token.write_text("eyJ.token.two")  # rotated: the next authentication reads the new one
    assert asyncio.run(provider.token()) == "eyJ.token.two"


def test_a_token_provider_hook_is_loaded_by_its_path() -> None:
    hooked = KafkaConnection(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider="tests.unit.test_connections:StaticTokens",
    )
    assert isinstance(token_provider(hooked), StaticTokens)
    missing = hooked.model_copy(update={"sasl_oauth_token_provider": "tests.unit.nowhere:Nope"})
    with pytest.raises(ConfigurationError, match="cannot be loaded"):
        token_provider(missing)
    wrong = hooked.model_copy(update={"sasl_oauth_token_provider": "pathlib:Path"})
    with pytest.raises(ConfigurationError, match="not an aiokafka AbstractTokenProvider"):
        token_provider(wrong)


class StaticTokens(FileTokenProvider):
    def __init__(self) -> None:
        super().__init__("/nonexistent")

    async def token(self) -> str:
        return "static"


def test_unreadable_tls_files_are_a_configuration_error() -> None:
    broken = KafkaConnection(security_protocol="SSL", ssl_cafile="/nonexistent/ca.pem")
    with pytest.raises(ConfigurationError, match="TLS files cannot be loaded"):
        kafka_security(broken)


def test_redis_acl_user_password_and_tls() -> None:
    plain = Settings()
    assert redis_options(plain) == {}
    secured = Settings(
        storage={
            "redis_url": "rediss://redis.internal:6380/0",
            "redis_username": "ratifier",
            "redis_password": "redis-secret",
            "redis_ssl_ca_file": "/etc/ratifier/redis-ca.pem",
        }
    )
    assert redis_options(secured) == {
        "username": "ratifier",
        "password": "redis-secret",
        "ssl_ca_certs": "/etc/ratifier/redis-ca.pem",
    }
    assert "redis-secret" not in repr(secured)
    with pytest.raises(ConfigurationError, match="rediss://"):
        redis_options(secured.changed(storage={"redis_url": "redis://redis.internal:6379/0"}))


def test_postgres_sslmode_is_added_to_the_url() -> None:
    plain = Settings(storage={"database_url": "postgresql://u:p@db:5432/ratifier"})
    assert database_conninfo(plain) == "postgresql://u:p@db:5432/ratifier"
    secured = plain.changed(
        storage={"database_sslmode": "verify-full", "database_sslrootcert": "/etc/pg/ca.pem"}
    )
    conninfo = database_conninfo(secured)
    assert "sslmode=verify-full" in conninfo
    assert "sslrootcert=/etc/pg/ca.pem" in conninfo
    assert "dbname=ratifier" in conninfo and "host=db" in conninfo
    with pytest.raises(ValidationError):
        Settings(storage={"database_sslmode": "sometimes"})


def write_self_signed_ca(directory: Path) -> Path:
    """A throw-away CA certificate (PEM) for loading into an SSL context."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ratifier test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_the_agent_client_takes_the_same_connection() -> None:
    secured = Settings(
        kafka=KafkaConnection(
            bootstrap="b1:9093",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="agent",
            sasl_password="agent-secret",
        )
    )
    client = RatifierClient.from_settings(secured)
    assert client._connection == secured.kafka
    legacy = RatifierClient(bootstrap="b2:9092")
    assert legacy._connection == KafkaConnection(bootstrap="b2:9092")
    moved = RatifierClient(bootstrap="b3:9093", connection=secured.kafka)
    assert moved._connection.bootstrap == "b3:9093"
    assert moved._connection.sasl_username == "agent"
