"""How every aiokafka client of ratifier connects, the agent client's and the services' alike
(runtime/clients.py builds the services' clients on it): security options, TLS context,
OAUTHBEARER token providers, and a start that names a refusal (authentication, TLS) instead
of aiokafka's "Unable to bootstrap"."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ssl
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, KafkaError, SaslAuthenticationFailed
from aiokafka.helpers import create_ssl_context

from schemas.connection import KafkaConnection
from schemas.errors import ConfigurationError

# How long the probe of a refused connection waits for each broker's answer.
REFUSAL_PROBE_SECONDS = 5.0


class FileTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """OAUTHBEARER tokens read from a file at every authentication (a sidecar rotates it)."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)

    async def token(self) -> str:
        text = await asyncio.to_thread(self._path.read_text)
        return text.strip()

    def __repr__(self) -> str:
        return f"FileTokenProvider({str(self._path)!r})"


def token_provider(connection: KafkaConnection) -> AbstractTokenProvider:
    """The OAUTHBEARER token provider ``connection`` names (a token file or a hook)."""
    if connection.sasl_oauth_token_file is not None:
        return FileTokenProvider(connection.sasl_oauth_token_file)
    module_name, _, attribute = (connection.sasl_oauth_token_provider or "").partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"kafka.sasl_oauth_token_provider {connection.sasl_oauth_token_provider!r} "
            f"cannot be loaded: {exc}"
        ) from exc
    provider = target() if callable(target) else target
    if not isinstance(provider, AbstractTokenProvider):
        raise ConfigurationError(
            f"kafka.sasl_oauth_token_provider {connection.sasl_oauth_token_provider!r} is not "
            "an aiokafka AbstractTokenProvider"
        )
    return provider


def kafka_ssl_context(connection: KafkaConnection) -> ssl.SSLContext | None:
    """The TLS context of an SSL or SASL_SSL connection (None for the others)."""
    if not connection.uses_tls:
        return None
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=connection.ssl_cafile,
            certfile=connection.ssl_certfile,
            keyfile=connection.ssl_keyfile,
            password=connection.ssl_key_password.get_secret_value()
            if connection.ssl_key_password is not None
            else None,
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"kafka TLS files cannot be loaded: {exc}") from exc
    context.check_hostname = connection.ssl_check_hostname
    return context


def kafka_security(connection: KafkaConnection) -> dict[str, Any]:
    """The bootstrap list and security options of every aiokafka client (consumer, producer,
    admin) for ``connection``."""
    options: dict[str, Any] = {
        "bootstrap_servers": connection.bootstrap,
        "security_protocol": connection.security_protocol,
    }
    context = kafka_ssl_context(connection)
    if context is not None:
        options["ssl_context"] = context
    if connection.uses_sasl:
        options["sasl_mechanism"] = connection.sasl_mechanism
        if connection.sasl_mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = token_provider(connection)
        else:
            options["sasl_plain_username"] = connection.sasl_username
            options["sasl_plain_password"] = (
                connection.sasl_password.get_secret_value()
                if connection.sasl_password is not None
                else None
            )
    return options


async def kafka_refusal(connection: KafkaConnection) -> ConfigurationError | None:
    """Why the brokers refuse ``connection``, when they do: authentication (wrong user or
    password, a token refused) or TLS trust (a broker certificate the CA does not sign).
    None when a broker accepts it, or when none answers (an unreachable broker is waited
    out; a refusal is not)."""
    security = kafka_security(connection)
    del security["bootstrap_servers"]
    for address in connection.bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), **security), REFUSAL_PROBE_SECONDS
            )
        except SaslAuthenticationFailed as exc:
            who = f" as {connection.sasl_username!r}" if connection.sasl_username else ""
            return ConfigurationError(
                f"Kafka authentication failed at {host}:{port} "
                f"({connection.sasl_mechanism}{who}): {exc}; check RATIFIER_KAFKA__SASL_* "
                "(user, password or token)"
            )
        except ssl.SSLCertVerificationError as exc:
            return ConfigurationError(
                f"Kafka TLS: the certificate of {host}:{port} is not trusted "
                f"({exc.verify_message}); check RATIFIER_KAFKA__SSL_CAFILE"
            )
        except (OSError, KafkaError, TimeoutError, ValueError):
            continue
        conn.close()
        return None
    return None


async def start_kafka_client(client: Any, connection: KafkaConnection) -> None:
    """Start an aiokafka client; when the brokers refuse it (authentication, TLS), raise a
    :class:`ConfigurationError` that says so instead of aiokafka's "Unable to bootstrap".
    A client that failed to start is closed (it may hold connections and tasks): a retry
    builds a new one."""
    try:
        await client.start()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await (client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop())
        if isinstance(exc, KafkaConnectionError):
            refusal = await kafka_refusal(connection)
            if refusal is not None:
                raise refusal from exc
        raise
