"""How a Kafka client reaches the pipeline's brokers: the bootstrap list, the security
protocol, TLS files and SASL credentials. Every service and every agent client connects with
it (the server's settings hold one as ``kafka``; the agent client reads its own)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class KafkaConnection(BaseModel):
    """How every Kafka client of ratifier connects (every aiokafka client; runtime/clients.py
    applies it): the bootstrap list, the security protocol, TLS files and SASL credentials.
    Read from ``RATIFIER_KAFKA__<FIELD>`` (docs/operations.md, "Secured connections")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # host:port[,host:port...]
    bootstrap: str = Field(default="127.0.0.1:9092", min_length=1)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    # TLS (SSL, SASL_SSL): the CA bundle that signed the brokers' certificates (default: the
    # system's), and a client certificate and key for mutual TLS.
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    # SASL (SASL_PLAINTEXT, SASL_SSL).
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # OAUTHBEARER: a file holding the current token (re-read at every authentication, so a
    # sidecar can rotate it), or "module:attribute" naming an aiokafka AbstractTokenProvider
    # (class or zero-argument factory) that fetches tokens itself.
    sasl_oauth_token_file: str | None = None
    sasl_oauth_token_provider: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
    )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        tls_files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)
        if not self.uses_tls and any(f is not None for f in tls_files):
            raise ValueError(f"TLS files given but security_protocol is {self.security_protocol}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate)")
        if not self.uses_sasl:
            if self.sasl_mechanism is not None:
                raise ValueError(
                    f"sasl_mechanism given but security_protocol is {self.security_protocol}"
                )
            return self
        if self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if self.sasl_mechanism == "OAUTHBEARER":
            sources = [self.sasl_oauth_token_file, self.sasl_oauth_token_provider]
            if sum(s is not None for s in sources) != 1:
                raise ValueError(
                    "OAUTHBEARER needs exactly one of sasl_oauth_token_file and "
                    "sasl_oauth_token_provider"
                )
        elif self.sasl_username is None or self.sasl_password is None:
            raise ValueError(f"{self.sasl_mechanism} needs sasl_username and sasl_password")
        return self
