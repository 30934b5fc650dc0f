"""One frozen settings model, read once at start from ``RATIFIER_*`` environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.names import Topic, topic_name


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RATIFIER_", frozen=True, extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = Field(default="ratifier.", pattern=r"^[A-Za-z0-9._-]*$", max_length=100)
    topic_partitions: int = Field(default=12, ge=1, le=1000)
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://ratifier:ratifier@127.0.0.1:5432/ratifier"
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
    metrics_host: str = "127.0.0.1"
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

    @property
    def stream_stages(self) -> frozenset[str]:
        return frozenset(s.strip() for s in self.streams_stages.split(",") if s.strip())

    def topic(self, topic: Topic) -> str:
        return topic_name(self.topic_prefix, topic)

    def group(self, group_id: str) -> str:
        """Consumer-group (and faust app) ids live under the topic prefix, so that two
        deployments sharing a broker under different prefixes never share a group."""
        return f"{self.topic_prefix}{group_id}"
