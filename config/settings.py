"""One frozen settings model, grouped by concern, read once at start from ``RATIFIER_*``
environment variables (a group's fields from ``RATIFIER_<GROUP>__<FIELD>``)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from schemas.connection import KafkaConnection as KafkaConnection
from schemas.errors import MissingKeyMaterial, UnknownSetting
from schemas.names import Topic, reply_namespace, topic_name
from schemas.vocabulary import StreamStage

PostgresSslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
# The one environment variable of the bootstrap list before `RATIFIER_KAFKA__BOOTSTRAP`; still
# read (a nested `RATIFIER_KAFKA__BOOTSTRAP` wins when both are set).
LEGACY_BOOTSTRAP_ENV = "RATIFIER_KAFKA_BOOTSTRAP"

# Development mode (docs/operations.md, "Development mode"): the only way the built-in key
# material below is ever used. Everyone who has read this file knows these values, so outside
# development mode a setting still holding one counts as missing and the start is refused.
DEVELOPMENT_MODE_ENV = "RATIFIER_DEVELOPMENT_MODE"
DEVELOPMENT_CONTEXT_SECRET = "ratifier-local-development-secret-change-me"  # noqa: S105
DEVELOPMENT_SIGNING_SEED = "ratifier-local-approval-signing-seed-change-me"
DEVELOPMENT_AUDIT_SALT = "ratifier-local-audit-salt"


class _LegacyBootstrap(PydanticBaseSettingsSource):
    """``RATIFIER_KAFKA_BOOTSTRAP`` → ``kafka.bootstrap`` (below the nested variables)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        value = os.environ.get(LEGACY_BOOTSTRAP_ENV)
        return {"kafka": {"bootstrap": value}} if value else {}


class Storage(BaseModel):
    """PostgreSQL (ledger, audit, domain data) and Redis (claims, approval state)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str = "postgresql://ratifier:ratifier@127.0.0.1:5432/ratifier"
    # libpq's sslmode and CA bundle, added to database_url's (these win); unset: the URL's.
    database_sslmode: PostgresSslMode | None = None
    database_sslrootcert: str | None = None
    # redis:// or rediss:// (TLS); an ACL user and its password (kept out of the URL, and out
    # of logs); the CA bundle of a rediss:// server (default: the system's).
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_ca_file: str | None = None


class ContextTokens(BaseModel):
    """How the context tokens agent runtimes send with calls are verified."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Local-only HS256 secret; production configures its own (and, later, JWKS keys).
    # The built-in value is accepted in development mode only.
    secret: str = Field(default=DEVELOPMENT_CONTEXT_SECRET, min_length=32)
    # HS256 with the secret above is for local use; production sets this false and points
    # RATIFIER_CONTEXT__JWKS_FILE at the runtime's public keys (EdDSA / RS256, by kid).
    hs256: bool = True
    jwks_file: str | None = None
    audience: str = "ratifier"
    issuer: str = "ratifier-local"
    clock_skew_seconds: int = Field(default=30, ge=0, le=300)
    # Tenants (comma-separated, "*" for all) whose calls must be bound to the agent runtime's
    # key: the context token names it (`cnf`) and each call carries a proof signed with it.
    call_binding_tenants: str = ""


class Policies(BaseModel):
    """Where the Cedar policies come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Directory with *.cedar policies and one *.cedarschema.json; default: the reference
    # domain's, commands/payments/policies.
    directory: str | None = None
    # Key of this deployment's policy set on the compacted `policies` topic.
    set_name: str = "default"
    # A local policy folder that differs from the published set in force is logged at ERROR
    # at start-up ("warn"), or stops start-up ("error").
    directory_mismatch: Literal["warn", "error"] = "warn"


class RecordLimits(BaseModel):
    """What a call may be (validation) and what a Kafka record may be (docs/reliability.md,
    "Limits"): topics are created with `max.message.bytes` = kafka_max_message_bytes, the
    producers may send that much, and consumers fetch at least that much per partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_record_bytes: int = Field(default=64 * 1024, ge=1024)
    kafka_max_message_bytes: int = Field(default=1_048_588, ge=64 * 1024)
    max_nesting_depth: int = Field(default=16, ge=2)
    max_string_length: int = Field(default=8192, ge=16)

    @model_validator(mode="after")
    def _aligned(self) -> RecordLimits:
        # A call that passes validation must fit in a Kafka record, with room for its
        # envelope as it moves on (docs/reliability.md, "Limits").
        if self.max_record_bytes * 2 > self.kafka_max_message_bytes:
            raise ValueError(
                "max_record_bytes must be at most half of kafka_max_message_bytes "
                f"({self.max_record_bytes} > {self.kafka_max_message_bytes} / 2)"
            )
        return self


class Executor(BaseModel):
    """The executor: Redis claim lease, bounded retries of failures known to precede any
    effect, the Redis fast path switch (the ledger alone decides when off), and the group
    commit of a partition batch's writes (off: one transaction per command)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    claim_lease_seconds: int = Field(default=30, ge=1)
    retry_attempts: int = Field(default=4, ge=1, le=20)
    redis_fast_path: bool = True
    group_commit: bool = True


class BreakerThresholds(BaseModel):
    """When a downstream's circuit breaker opens and how it closes again (docs/execution.md,
    "Circuit breakers"): over the last ``window_seconds``, with at least ``min_calls``
    effects attempted, it opens when the share of failures reaches ``failure_rate`` or the
    share slower than ``slow_call_ms`` passes ``slow_call_rate`` (0.1: the p90 latency is
    above ``slow_call_ms``). Open, it refuses for ``cooldown_seconds``, then lets
    ``half_open_probes`` calls through: all succeed, it closes; one fails, it opens again.
    A catalog's tool may declare its own (`commands.catalog.Tool.breaker`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_seconds: int = Field(default=10, ge=1, le=300)
    min_calls: int = Field(default=10, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    slow_call_ms: int = Field(default=5000, ge=1)
    slow_call_rate: float = Field(default=0.1, gt=0, le=1)
    cooldown_seconds: float = Field(default=5.0, gt=0, le=3600)
    half_open_probes: int = Field(default=3, ge=1, le=100)


class Breakers(BreakerThresholds):
    """Circuit breakers of the executor: the defaults of every downstream, and the switch
    (off: no breaker is consulted or fed)."""

    enabled: bool = True


class Reconciler(BaseModel):
    """The reconciler: checks per unknown operation before escalating to humans, the first
    backoff (doubling) and its cap (docs/execution.md: the bound)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=8, ge=1)
    backoff_seconds: float = Field(default=1.0, gt=0)
    backoff_cap_seconds: float = Field(default=300.0, gt=0)


class Approvals(BaseModel):
    """Human approvals (docs/approvals.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # How long a request waits for a human (tools may set their own), and how long a
    # decision that arrives before its request is held.
    ttl_seconds: int = Field(default=15 * 60, ge=1)
    hold_seconds: int = Field(default=60, ge=1)
    # Signed decisions. The approval service signs decisions of the humans it authenticated,
    # and receipts, with one private key (PEM, Ed25519 or P-256) under ``signing_kid``.
    # Without a key file the key is DERIVED from ``signing_seed``, in development mode only
    # (every process of a local deployment derives the same key); any other start needs the
    # file (`ratifier keys generate` writes one).
    # Older service public keys (rotation) and approvers' own keys (EdDSA / ES256, each entry
    # naming its ``sub``, ``tenant`` and ``roles``) are trusted from JWKS files.
    signing_key_file: str | None = None
    signing_kid: str = Field(default="ratifier-local-approvals-1", min_length=1)
    signing_seed: str = Field(default=DEVELOPMENT_SIGNING_SEED, min_length=32)
    service_jwks_file: str | None = None
    approver_jwks_file: str | None = None
    # Approver rights (Cedar): a directory with *.cedar and approvers.cedarschema.json;
    # default: the reference set in approvals/policies.
    approver_policy_dir: str | None = None
    # How long a decision signed by the service stays usable, and how long a terminal
    # approval state is kept after the request's expiry (besides the clock skew) before it
    # is deleted: until then a replayed decision is still recognised as used.
    decision_validity_seconds: int = Field(default=15 * 60, ge=1)
    retention_margin_seconds: int = Field(default=300, ge=0)


def _stage_list(value: Any) -> Any:
    if isinstance(value, str):
        return frozenset(s.strip() for s in value.split(",") if s.strip())
    return value


class Streams(BaseModel):
    """The streams worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Which stream stages this worker runs (comma-separated in the environment), so that
    # stages can be scaled and deployed apart.
    stages: Annotated[frozenset[StreamStage], NoDecode, BeforeValidator(_stage_list)] = frozenset(
        StreamStage
    )
    # The approver HTTP endpoint (and the worker's /metrics, /healthz); 0: none.
    http_port: int = Field(default=6066, ge=0, le=65535)
    # Under `ratifier streams` (stages and approval-join launched together), the join's own
    # /metrics, /healthz and /readyz port; 0: none (`ratifier approval-join` alone serves
    # http_port).
    join_http_port: int = Field(default=0, ge=0, le=65535)


class Admission(BaseModel):
    """Fleet admission at the validator (docs/operations.md, "Admission and limits"): what to
    do when Redis (the shared token buckets) cannot be reached, and load shedding by the
    lag of the next stages' consumer groups."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Redis away: admit reads anyway (open) and refuse writes (closed), by default.
    fail_open_reads: bool = True
    fail_open_writes: bool = False
    # Records not yet read by the authorizer, approval-join and executor groups (the largest
    # of the three): above ``shed_bulk_lag`` bulk calls are refused, above ``shed_all_lag``
    # every call; 0 turns shedding off. Measured every ``lag_probe_seconds``.
    shed_bulk_lag: int = Field(default=20_000, ge=0)
    shed_all_lag: int = Field(default=100_000, ge=0)
    lag_probe_seconds: float = Field(default=2.0, gt=0)
    # The retry advice of a refusal by shedding or an unreachable Redis, and the most any
    # refusal advises.
    shed_retry_after_seconds: float = Field(default=2.0, gt=0)
    max_retry_after_seconds: float = Field(default=60.0, gt=0)
    # A call admitted under a concurrency limit holds its slot until its final outcome is
    # seen, or this long at most (a lost outcome cannot keep the slot forever).
    concurrency_lease_seconds: int = Field(default=300, ge=1)
    # Calls whose context token does not verify (issue 45, "Forged floods count"): per claimed
    # tenant ``unverified_rate`` calls/s with bursts of ``unverified_burst``, and all of them
    # together ``unverified_fleet_rate``/``unverified_fleet_burst``; beyond, refused
    # ``rate_limited`` at admission. Never a verified tenant's tokens.
    unverified_rate: float = Field(default=20.0, gt=0)
    unverified_burst: float = Field(default=50.0, ge=1)
    unverified_fleet_rate: float = Field(default=200.0, gt=0)
    unverified_fleet_burst: float = Field(default=400.0, ge=1)
    # Fair shares across validator workers (issue 45): while several workers draw from one
    # rate bucket (each asked it within this many seconds) and the bucket runs low, each takes
    # at most its share (rate / workers) so none starves while another takes the refill
    # (streams/lua/admit.lua); 0 turns this off (the first to ask after a refill takes it).
    fair_share_window_seconds: float = Field(default=1.0, ge=0)
    # Fair by default (issue 45; streams/fair_share.py), with or without declared limits:
    # while a lane stage's queueing delay (its oldest record fetched and not yet started) is
    # above ``fair_target_seconds`` for ``fair_interval_seconds``, the calls of tenants
    # above their fair share (calling at least ``fair_active_rate``/s, rates averaged over
    # ``fair_usage_seconds``) are shed, more each ``fair_tick_seconds`` while it stays above;
    # a tenant alone is never shed. 0 turns it off.
    fair_target_seconds: float = Field(default=0.010, ge=0)
    fair_tick_seconds: float = Field(default=0.025, gt=0)
    fair_interval_seconds: float = Field(default=0.05, ge=0)
    fair_usage_seconds: float = Field(default=1.0, gt=0)
    fair_active_rate: float = Field(default=1.0, gt=0)


class Replies(BaseModel):
    """Reply routing (docs/agents.md, "Reply topics")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # How long a stage waits for the broker to take one reply copy before it skips it (the
    # outcome itself is on `outcomes` regardless), and how long a reply topic that failed is
    # skipped before it is tried again.
    send_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    skip_seconds: float = Field(default=30.0, ge=0, le=3600)


class Observability(BaseModel):
    """Logs, metrics, health and traces (docs/observability.md, docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_level: str = "INFO"
    # The address every HTTP endpoint of a service binds: metrics, /healthz and /readyz, the
    # streams worker's web app, the dashboard (the k8s manifests set 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    # Prometheus `/metrics` ports of the executor, the reconciler and the audit sink (0: none;
    # the streams worker serves it on streams.http_port).
    executor_metrics_port: int = Field(default=9102, ge=0, le=65535)
    reconciler_metrics_port: int = Field(default=9103, ge=0, le=65535)
    audit_metrics_port: int = Field(default=9104, ge=0, le=65535)
    # Health (docs/operations.md, "Health"): a service whose loop has not turned for
    # health_stale_seconds is not alive; one whose consumer has not polled for
    # health_poll_seconds, or lags more than health_max_lag records, is not ready.
    health_stale_seconds: float = Field(default=60.0, gt=0)
    health_poll_seconds: float = Field(default=30.0, gt=0)
    health_max_lag: int = Field(default=10_000, ge=0)
    # Where spans go: '' (off), 'otlp' (OTLP/HTTP to otel_endpoint), 'console', or
    # 'jsonl:/path'.
    otel_exporter: str = Field(default="", pattern=r"^(|otlp|console|jsonl:.+)$")
    otel_endpoint: str = "http://127.0.0.1:4318/v1/traces"


class Notifications(BaseModel):
    """Approver notifications by signed webhooks (`ratifier notifier`, docs/notifications.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The per-tenant endpoints (JSON or TOML); unset: the notifier has nothing to deliver to.
    endpoints_file: str | None = None
    # Where an approver decides: each notification links to <dashboard_url>?call=<call id>.
    dashboard_url: str = Field(default="http://127.0.0.1:6070/", pattern=r"^https?://")
    # One attempt's bound, the retry backoff (doubling from backoff_seconds, capped), and when
    # a delivery is dead-lettered: after max_attempts attempts or max_age_seconds since queued.
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    backoff_seconds: float = Field(default=2.0, gt=0)
    backoff_cap_seconds: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=10, ge=1, le=100)
    max_age_seconds: float = Field(default=24 * 3600.0, gt=0)
    # Deliveries in flight per tenant, and how often an idle dispatcher looks for due ones
    # (requests this process queues wake it at once).
    concurrency_per_tenant: int = Field(default=8, ge=1, le=256)
    poll_seconds: float = Field(default=1.0, gt=0, le=60)
    # /metrics, /healthz, /readyz of the notifier (0: none).
    metrics_port: int = Field(default=9105, ge=0, le=65535)


class Settings(BaseSettings):
    """Grouped by concern; each group is read from ``RATIFIER_<GROUP>__<FIELD>``
    (``RATIFIER_STORAGE__DATABASE_URL``), the few top-level values from ``RATIFIER_<FIELD>``
    (docs/operations.md, "Settings")."""

    # An unknown keyword is an error (a misspelt or renamed setting must not silently keep its
    # default); so is an unknown RATIFIER_* environment variable, checked at every start
    # (`check_environment`).
    model_config = SettingsConfigDict(
        env_prefix="RATIFIER_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    # Every Kafka client's connection: RATIFIER_KAFKA__BOOTSTRAP, RATIFIER_KAFKA__SECURITY_PROTOCOL,
    # ... (RATIFIER_KAFKA_BOOTSTRAP still sets the bootstrap list).
    kafka: KafkaConnection = KafkaConnection()
    storage: Storage = Storage()
    context: ContextTokens = ContextTokens()
    policies: Policies = Policies()
    limits: RecordLimits = RecordLimits()
    executor: Executor = Executor()
    breakers: Breakers = Breakers()
    reconciler: Reconciler = Reconciler()
    approvals: Approvals = Approvals()
    streams: Streams = Streams()
    observability: Observability = Observability()
    replies: Replies = Replies()
    notifications: Notifications = Notifications()
    admission: Admission = Admission()
    topic_prefix: str = Field(default="ratifier.", pattern=r"^[A-Za-z0-9._-]*$", max_length=100)
    topic_partitions: int = Field(default=12, ge=1, le=1000)
    catalog: str = "commands.reference:catalog"
    # `ratifier dashboard` serves the web dashboard here, on 127.0.0.1.
    dashboard_port: int = Field(default=6070, ge=1, le=65535)
    # `ratifier mcp` serves the catalog over MCP (streamable HTTP) here, on /mcp.
    mcp_port: int = Field(default=6071, ge=1, le=65535)
    # Keys the audit's pseudonyms of masked values; the built-in one in development mode only.
    audit_salt: str = Field(default=DEVELOPMENT_AUDIT_SALT, min_length=1)
    # Built-in key material (context secret, approval signing seed, audit salt) may be used:
    # local demos and tests only; logged at WARNING at start.
    development_mode: bool = False
    # The payment provider the refund domain pays through (`python -m testsupport.provider`
    # runs a fake one).
    provider_url: str = "http://127.0.0.1:8765"
    # `ratifier approvals`: the approver's context token when --token is not given.
    approver_token: SecretStr | None = None
    # The local deployment (deploy/local, `ratifier demo`): its data, logs and pid files, and
    # the `ratifier` command to show people (both shared with the shell scripts, hence flat).
    local_home: Path = Path.home() / ".cache" / "ratifier-local"
    bin: str = "ratifier"

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
        """Every environment variable these settings read (groups' fields with ``__``)."""
        names = {LEGACY_BOOTSTRAP_ENV}
        for name, field in cls.model_fields.items():
            group = field.annotation
            if isinstance(group, type) and issubclass(group, BaseModel):
                names |= {f"RATIFIER_{name.upper()}__{n.upper()}" for n in group.model_fields}
            else:
                names.add(f"RATIFIER_{name.upper()}")
        return frozenset(names)

    def missing_key_material(self) -> tuple[str, ...]:
        """The settings that still lack real key material (none in development mode)."""
        if self.development_mode:
            return ()
        missing: list[str] = []
        if self.context.hs256 and self.context.secret == DEVELOPMENT_CONTEXT_SECRET:
            missing.append("RATIFIER_CONTEXT__SECRET")
        if not self.context.hs256 and self.context.jwks_file is None:
            missing.append("RATIFIER_CONTEXT__JWKS_FILE")
        if self.approvals.signing_key_file is None:
            missing.append("RATIFIER_APPROVALS__SIGNING_KEY_FILE")
        if self.audit_salt == DEVELOPMENT_AUDIT_SALT:
            missing.append("RATIFIER_AUDIT_SALT")
        return tuple(missing)

    def require_key_material(self, *names: str) -> None:
        """Raise `MissingKeyMaterial` unless every one of ``names`` (default: all) holds real
        key material, or development mode is on."""
        missing = [m for m in self.missing_key_material() if not names or m in names]
        if missing:
            raise MissingKeyMaterial(
                f"no key material for {', '.join(missing)} (built-in keys are for development "
                f"only): set {' and '.join(missing)} (`ratifier keys generate --out DIR` writes "
                f"them), or {DEVELOPMENT_MODE_ENV}=true on a local development machine"
            )

    @property
    def kafka_bootstrap(self) -> str:
        """The bootstrap list (``kafka.bootstrap``)."""
        return self.kafka.bootstrap

    def changed(self, **changes: Any) -> Settings:
        """These settings with some values changed: a top-level value as itself, a group's
        fields as a mapping (``changed(storage={"database_url": url})``), validated again."""
        update: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in type(self).model_fields:
                raise ValueError(f"no setting {name!r}")
            current = getattr(self, name)
            if isinstance(current, BaseModel) and isinstance(value, Mapping):
                update[name] = type(current).model_validate(current.model_dump() | dict(value))
            else:
                update[name] = value
        return self.model_copy(update=update)

    def with_kafka(self, **changes: Any) -> Settings:
        """These settings with ``kafka`` changed (validated again)."""
        return self.changed(kafka=changes)

    def topic(self, topic: Topic) -> str:
        return topic_name(self.topic_prefix, topic)

    @property
    def reply_namespace(self) -> str:
        """The only topic-name prefix a call's ``reply_to`` may name (`schemas.names`)."""
        return reply_namespace(self.topic_prefix)

    def group(self, group_id: str) -> str:
        """Consumer-group ids live under the topic prefix, so that two
        deployments sharing a broker under different prefixes never share a group."""
        return f"{self.topic_prefix}{group_id}"


# RATIFIER_* variables that are not settings, so never refused: the knobs of deploy/local's
# scripts (exact names; docs/operations.md, "Local deployment knobs") and of the test, fuzz,
# chaos, partitions, soak and bench suites (reserved sub-prefixes no setting starts with).
HARNESS_PREFIXES = (
    "RATIFIER_TEST_",
    "RATIFIER_FUZZ_",
    "RATIFIER_CHAOS_",
    "RATIFIER_PARTITIONS_",
    "RATIFIER_SOAK_",
    "RATIFIER_BENCH_",
)
LOCAL_DEPLOYMENT_VARIABLES = frozenset(
    {
        "RATIFIER_CHROMIUM",
        "RATIFIER_KAFKA_BROKERS",
        "RATIFIER_KAFKA_CONTROLLER_PORT",
        "RATIFIER_KAFKA_DATA_DIR",
        "RATIFIER_KAFKA_HEAP_OPTS",
        "RATIFIER_KAFKA_INSTANCE",
        "RATIFIER_KAFKA_JARS_DIR",
        "RATIFIER_KAFKA_JIT_OPTS",
        "RATIFIER_KAFKA_MIN_ISR",
        "RATIFIER_KAFKA_NODE_HEAP_OPTS",
        "RATIFIER_KAFKA_PORT",
        "RATIFIER_KAFKA_PORT_BASE",
        "RATIFIER_KAFKA_RESET",
        "RATIFIER_KAFKA_SASL",
        # Not RATIFIER_KAFKA_SASL_*: too close to the RATIFIER_KAFKA__SASL_* settings.
        "RATIFIER_KAFKA_SCRAM_ADMIN_PASSWORD",
        "RATIFIER_KAFKA_SCRAM_PASSWORD",
        "RATIFIER_KAFKA_SCRAM_USER",
        "RATIFIER_KAFKA_VERSION",
        "RATIFIER_KAFKA_WAIT",
        "RATIFIER_LOG4J_VERSION",
        "RATIFIER_PG_CLUSTER",
        "RATIFIER_PG_DATABASES",
        "RATIFIER_PG_PASSWORD",
        "RATIFIER_PG_PORT",
        "RATIFIER_PG_USER",
        "RATIFIER_PG_WAIT",
        "RATIFIER_REDIS_DATA_DIR",
        "RATIFIER_REDIS_PORT",
        "RATIFIER_REDIS_WAIT",
        "RATIFIER_STOP_WAIT",
    }
)
# Flat names of the settings before they were grouped (docs/operations.md, "Renamed
# settings"), and the few that are gone.
RENAMED_SETTINGS: dict[str, str] = {
    "RATIFIER_DATABASE_URL": "RATIFIER_STORAGE__DATABASE_URL",
    "RATIFIER_REDIS_URL": "RATIFIER_STORAGE__REDIS_URL",
    "RATIFIER_CONTEXT_SECRET": "RATIFIER_CONTEXT__SECRET",
    "RATIFIER_CONTEXT_JWKS_FILE": "RATIFIER_CONTEXT__JWKS_FILE",
    "RATIFIER_CONTEXT_AUDIENCE": "RATIFIER_CONTEXT__AUDIENCE",
    "RATIFIER_CONTEXT_ISSUER": "RATIFIER_CONTEXT__ISSUER",
    "RATIFIER_CLOCK_SKEW_SECONDS": "RATIFIER_CONTEXT__CLOCK_SKEW_SECONDS",
    "RATIFIER_POLICY_DIR": "RATIFIER_POLICIES__DIRECTORY",
    "RATIFIER_POLICY_SET_NAME": "RATIFIER_POLICIES__SET_NAME",
    "RATIFIER_POLICY_DIR_MISMATCH": "RATIFIER_POLICIES__DIRECTORY_MISMATCH",
    "RATIFIER_MAX_RECORD_BYTES": "RATIFIER_LIMITS__MAX_RECORD_BYTES",
    "RATIFIER_KAFKA_MAX_MESSAGE_BYTES": "RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES",
    "RATIFIER_MAX_NESTING_DEPTH": "RATIFIER_LIMITS__MAX_NESTING_DEPTH",
    "RATIFIER_MAX_STRING_LENGTH": "RATIFIER_LIMITS__MAX_STRING_LENGTH",
    "RATIFIER_CLAIM_LEASE_SECONDS": "RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS",
    "RATIFIER_RETRY_ATTEMPTS": "RATIFIER_EXECUTOR__RETRY_ATTEMPTS",
    "RATIFIER_REDIS_FAST_PATH": "RATIFIER_EXECUTOR__REDIS_FAST_PATH",
    "RATIFIER_RECONCILE_ATTEMPTS": "RATIFIER_RECONCILER__ATTEMPTS",
    "RATIFIER_RECONCILE_BACKOFF_SECONDS": "RATIFIER_RECONCILER__BACKOFF_SECONDS",
    "RATIFIER_RECONCILE_BACKOFF_CAP_SECONDS": "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS",
    "RATIFIER_LOG_LEVEL": "RATIFIER_OBSERVABILITY__LOG_LEVEL",
    "RATIFIER_APPROVAL_TTL_SECONDS": "RATIFIER_APPROVALS__TTL_SECONDS",
    "RATIFIER_APPROVAL_HOLD_SECONDS": "RATIFIER_APPROVALS__HOLD_SECONDS",
    "RATIFIER_HTTP_PORT": "RATIFIER_STREAMS__HTTP_PORT",
    "RATIFIER_STREAMS_STAGES": "RATIFIER_STREAMS__STAGES",
    "RATIFIER_EXECUTOR_METRICS_PORT": "RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT",
    "RATIFIER_RECONCILER_METRICS_PORT": "RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT",
    "RATIFIER_AUDIT_METRICS_PORT": "RATIFIER_OBSERVABILITY__AUDIT_METRICS_PORT",
    "RATIFIER_METRICS_HOST": "RATIFIER_OBSERVABILITY__METRICS_HOST",
    "RATIFIER_OTEL_EXPORTER": "RATIFIER_OBSERVABILITY__OTEL_EXPORTER",
    "RATIFIER_OTEL_ENDPOINT": "RATIFIER_OBSERVABILITY__OTEL_ENDPOINT",
}
REMOVED_SETTINGS: dict[str, str] = {
    "RATIFIER_EXECUTOR_CRASH_AT": "crash tests run `python -m testsupport.crashing`",
    "RATIFIER_RECONCILER_CRASH_AT": "crash tests run `python -m testsupport.crashing`",
}


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One line per ``RATIFIER_*`` variable in ``environ`` that no setting reads, each with
    the new name of a renamed setting or the closest valid name."""
    valid = Settings.environment_names()
    problems: list[str] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("RATIFIER_") or upper in valid:
            continue
        if upper.startswith(HARNESS_PREFIXES) or upper in LOCAL_DEPLOYMENT_VARIABLES:
            continue
        if upper in RENAMED_SETTINGS:
            problems.append(f"{name} was renamed to {RENAMED_SETTINGS[upper]}")
        elif upper in REMOVED_SETTINGS:
            problems.append(f"{name} is no longer a setting: {REMOVED_SETTINGS[upper]}")
        else:
            close = difflib.get_close_matches(upper, sorted(valid), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else " (docs/operations.md, 'Settings')"
            problems.append(f"{name} is not a setting{hint}")
    return problems


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise `UnknownSetting` if ``environ`` (default: this process's) holds a ``RATIFIER_*``
    variable that no setting reads: a misspelt or renamed setting must stop the start, not
    leave its default in force unnoticed."""
    problems = unknown_settings(os.environ if environ is None else environ)
    if problems:
        raise UnknownSetting("; ".join(problems))
