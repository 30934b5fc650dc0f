"""One frozen settings model, read once at start from ``RATIFIER_*`` environment variables."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from schemas.names import Topic, reply_namespace, topic_name

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
PostgresSslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
# The one environment variable of the bootstrap list before `RATIFIER_KAFKA__BOOTSTRAP`; still
# read (a nested `RATIFIER_KAFKA__BOOTSTRAP` wins when both are set).
LEGACY_BOOTSTRAP_ENV = "RATIFIER_KAFKA_BOOTSTRAP"


class KafkaConnection(BaseModel):
    """How every Kafka client of ratifier connects (aiokafka and faust alike; runtime/clients.py
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


class _LegacyBootstrap(PydanticBaseSettingsSource):
    """``RATIFIER_KAFKA_BOOTSTRAP`` → ``kafka.bootstrap`` (below the nested variables)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        value = os.environ.get(LEGACY_BOOTSTRAP_ENV)
        return {"kafka": {"bootstrap": value}} if value else {}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RATIFIER_", frozen=True, extra="ignore", env_nested_delimiter="__"
    )

    # Every Kafka client's connection: RATIFIER_KAFKA__BOOTSTRAP, RATIFIER_KAFKA__SECURITY_PROTOCOL,
    # ... (RATIFIER_KAFKA_BOOTSTRAP still sets the bootstrap list).
    kafka: KafkaConnection = KafkaConnection()
    topic_prefix: str = Field(default="ratifier.", pattern=r"^[A-Za-z0-9._-]*$", max_length=100)
    topic_partitions: int = Field(default=12, ge=1, le=1000)
    # redis:// or rediss:// (TLS); an ACL user and its password (kept out of the URL, and out
    # of logs); the CA bundle of a rediss:// server (default: the system's).
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_ca_file: str | None = None
    database_url: str = "postgresql://ratifier:ratifier@127.0.0.1:5432/ratifier"
    # libpq's sslmode and CA bundle, added to database_url's (these win); unset: the URL's.
    database_sslmode: PostgresSslMode | None = None
    database_sslrootcert: str | None = None
    # Local-only HS256 secret; production configures its own (and, later, JWKS keys).
    context_secret: str = Field(
        default="ratifier-local-development-secret-change-me", min_length=32
    )
    # HS256 with the secret above is for local use; production sets this false and points
    # RATIFIER_CONTEXT_JWKS_FILE at the runtime's public keys (EdDSA / RS256, by kid).
    context_hs256: bool = True
    context_jwks_file: str | None = None
    context_audience: str = "ratifier"
    context_issuer: str = "ratifier-local"
    clock_skew_seconds: int = Field(default=30, ge=0, le=300)
    # Tenants (comma-separated, "*" for all) whose calls must be bound to the agent runtime's
    # key: the context token names it (`cnf`) and each call carries a proof signed with it.
    call_binding_tenants: str = ""
    catalog: str = "commands.reference:catalog"
    # Directory with *.cedar policies and one *.cedarschema.json; default: commands/policies.
    policy_dir: str | None = None
    # Key of this deployment's policy set on the compacted `policies` topic.
    policy_set_name: str = "default"
    # A local policy folder that differs from the published set in force is logged at ERROR
    # at start-up ("warn"), or stops start-up ("error").
    policy_dir_mismatch: Literal["warn", "error"] = "warn"
    # What a call may be (validation) and what a Kafka record may be (docs/reliability.md,
    # "Limits"): topics are created with `max.message.bytes` = kafka_max_message_bytes, the
    # producers may send that much, and consumers fetch at least that much per partition.
    max_record_bytes: int = Field(default=64 * 1024, ge=1024)
    kafka_max_message_bytes: int = Field(default=1_048_588, ge=64 * 1024)
    max_nesting_depth: int = Field(default=16, ge=2)
    max_string_length: int = Field(default=8192, ge=16)
    # Executor: Redis claim lease, bounded retries of failures known to precede any effect,
    # the Redis fast path switch (the ledger alone decides when off), and crash-test faults.
    claim_lease_seconds: int = Field(default=30, ge=1)
    retry_attempts: int = Field(default=4, ge=1, le=20)
    redis_fast_path: bool = True
    executor_crash_at: str | None = None
    # Reconciler: checks per unknown operation before escalating to humans, the first
    # backoff (doubling) and its cap, and crash-test faults (docs/execution.md: the bound).
    reconcile_attempts: int = Field(default=8, ge=1)
    reconcile_backoff_seconds: float = Field(default=1.0, gt=0)
    reconcile_backoff_cap_seconds: float = Field(default=300.0, gt=0)
    reconciler_crash_at: str | None = None
    log_level: str = "INFO"
    # Approvals: how long a request waits for a human (tools may set their own), how long a
    # decision that arrives before its request is held, and the approver HTTP endpoint.
    approval_ttl_seconds: int = Field(default=15 * 60, ge=1)
    approval_hold_seconds: int = Field(default=60, ge=1)
    http_port: int = Field(default=6066, ge=0, le=65535)  # 0: no HTTP endpoint
    # Signed decisions (docs/approvals.md). The approval service signs decisions of the
    # humans it authenticated, and receipts, with one private key (PEM, Ed25519 or P-256)
    # under ``approval_signing_kid``. Without a key file the key is DERIVED from
    # ``approval_signing_seed`` (local development only: every process of a local deployment
    # derives the same key; production sets the file). Older service public keys (rotation)
    # and approvers' own keys (EdDSA / ES256, each entry naming its ``sub``, ``tenant`` and
    # ``roles``) are trusted from JWKS files.
    approval_signing_key_file: str | None = None
    approval_signing_kid: str = Field(default="ratifier-local-approvals-1", min_length=1)
    approval_signing_seed: str = Field(
        default="ratifier-local-approval-signing-seed-change-me", min_length=32
    )
    approval_service_jwks_file: str | None = None
    approver_jwks_file: str | None = None
    # How long a decision signed by the service stays usable, and how long a terminal
    # approval state is kept after the request's expiry (besides the clock skew) before it
    # is deleted: until then a replayed decision is still recognised as used.
    # Approver rights (Cedar): a directory with *.cedar and approvers.cedarschema.json;
    # default: the reference set in approvals/policies.
    approver_policy_dir: str | None = None
    approval_decision_validity_seconds: int = Field(default=15 * 60, ge=1)
    approval_retention_margin_seconds: int = Field(default=300, ge=0)
    # `ratifier dashboard` serves the web dashboard here, on 127.0.0.1.
    dashboard_port: int = Field(default=6070, ge=1, le=65535)
    # `ratifier mcp` serves the catalog over MCP (streamable HTTP) here, on /mcp.
    mcp_port: int = Field(default=6071, ge=1, le=65535)
    audit_salt: str = "ratifier-local-audit-salt"
    # The payment provider the refund domain pays through (`python -m testsupport.provider` runs a
    # fake one).
    provider_url: str = "http://127.0.0.1:8765"
    # Which stream stages this worker runs (comma-separated), so that stages can be scaled
    # and deployed apart: validator, authorizer, approval-join.
    streams_stages: str = "validator,authorizer,approval-join"
    # Observability (docs/observability.md): Prometheus `/metrics` ports of the executor and
    # the reconciler (0: none; the streams worker serves it on http_port), and where spans go:
    # '' (off), 'otlp' (OTLP/HTTP to otel_endpoint), 'console', or 'jsonl:/path'.
    executor_metrics_port: int = Field(default=9102, ge=0, le=65535)
    reconciler_metrics_port: int = Field(default=9103, ge=0, le=65535)
    audit_metrics_port: int = Field(default=9104, ge=0, le=65535)
    # The address every HTTP endpoint of a service binds: metrics, /healthz and /readyz, the
    # streams worker's web app, the dashboard (the k8s manifests set 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    # Health (docs/operations.md, "Health"): a service whose loop has not turned for
    # health_stale_seconds is not alive; one whose consumer has not polled for
    # health_poll_seconds, or lags more than health_max_lag records, is not ready.
    health_stale_seconds: float = Field(default=60.0, gt=0)
    health_poll_seconds: float = Field(default=30.0, gt=0)
    health_max_lag: int = Field(default=10_000, ge=0)
    # Reply routing (docs/agents.md, "Reply topics"): how long a stage waits for the broker to
    # take one reply copy before it skips it (the outcome itself is on `outcomes` regardless),
    # and how long a reply topic that failed is skipped before it is tried again.
    reply_send_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    reply_skip_seconds: float = Field(default=30.0, ge=0, le=3600)
    otel_exporter: str = Field(default="", pattern=r"^(|otlp|console|jsonl:.+)$")
    otel_endpoint: str = "http://127.0.0.1:4318/v1/traces"

    @model_validator(mode="after")
    def _limits_aligned(self) -> Settings:
        # A call that passes validation must fit in a Kafka record, with room for its
        # envelope as it moves on (docs/reliability.md, "Limits").
        if self.max_record_bytes * 2 > self.kafka_max_message_bytes:
            raise ValueError(
                "max_record_bytes must be at most half of kafka_max_message_bytes "
                f"({self.max_record_bytes} > {self.kafka_max_message_bytes} / 2)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            _LegacyBootstrap(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    @classmethod
    def environment_names(cls) -> frozenset[str]:
        """Every environment variable these settings read (nested ones with ``__``)."""
        names = {LEGACY_BOOTSTRAP_ENV}
        for name in cls.model_fields:
            if name == "kafka":
                names |= {f"RATIFIER_KAFKA__{n.upper()}" for n in KafkaConnection.model_fields}
            else:
                names.add(f"RATIFIER_{name.upper()}")
        return frozenset(names)

    @property
    def kafka_bootstrap(self) -> str:
        """The bootstrap list (``kafka.bootstrap``)."""
        return self.kafka.bootstrap

    def with_kafka(self, **changes: Any) -> Settings:
        """These settings with ``kafka`` changed (validated again)."""
        kafka = KafkaConnection.model_validate(self.kafka.model_dump() | changes)
        return self.model_copy(update={"kafka": kafka})

    @property
    def stream_stages(self) -> frozenset[str]:
        return frozenset(s.strip() for s in self.streams_stages.split(",") if s.strip())

    def topic(self, topic: Topic) -> str:
        return topic_name(self.topic_prefix, topic)

    @property
    def reply_namespace(self) -> str:
        """The only topic-name prefix a call's ``reply_to`` may name (`schemas.names`)."""
        return reply_namespace(self.topic_prefix)

    def group(self, group_id: str) -> str:
        """Consumer-group (and faust app) ids live under the topic prefix, so that two
        deployments sharing a broker under different prefixes never share a group."""
        return f"{self.topic_prefix}{group_id}"
