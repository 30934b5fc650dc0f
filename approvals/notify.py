"""Approver notifications by signed webhooks: the pure parts (docs/notifications.md).

- which endpoints an approval request goes to (per tenant, by kind: every request to the
  ``approver`` endpoints; a request naming a ``subject`` also to the ``confirmation`` ones);
- the delivery id, stable per (request, endpoint, kind), that receivers deduplicate on;
- the payload: what a human needs to decide and a link to decide, never a credential;
- the signature ``t=<unix>,v1=<hex HMAC-SHA256(secret, f"{t}.{body}")>`` and its check
  (:func:`verify_signature`, for receivers), with a replay window;
- the retry schedule and the dead-letter bound.

The notifier service (:mod:`approvals.notifier`) does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from schemas.envelopes import TENANT_PATTERN, ApprovalRequest, DecisionKind
from schemas.errors import ConfigurationError

SIGNATURE_SCHEME = "v1"
# How far a receiver accepts a signature's timestamp from its own clock (both ways), unless
# it says otherwise: a captured request replayed later than this is refused.
DEFAULT_TOLERANCE_SECONDS = 300
# The longest failure reason kept (the dead letter's `last_error`, the outbox row).
MAX_ERROR_CHARS = 300

EndpointName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,128}$")]


class EndpointSpec(BaseModel):
    """One webhook endpoint as declared in the endpoints file. The HMAC secret is named
    (an environment variable or a file), never written in the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: EndpointName
    url: str = Field(pattern=r"^https?://[^\s]+$", max_length=2048)
    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    secret_file: str | None = None
    kinds: tuple[DecisionKind, ...] = Field(default=(DecisionKind.APPROVER,), min_length=1)

    @model_validator(mode="after")
    def _one_secret_source(self) -> EndpointSpec:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("give exactly one of secret_env and secret_file")
        return self


class EndpointsFile(BaseModel):
    """The endpoints file: ``{"tenants": {"<tenant>": [<endpoint>, ...]}}`` (or TOML)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: dict[Annotated[str, StringConstraints(pattern=TENANT_PATTERN)], list[EndpointSpec]]

    @model_validator(mode="after")
    def _unique_names(self) -> EndpointsFile:
        for tenant, endpoints in self.tenants.items():
            names = [e.name for e in endpoints]
            if len(names) != len(set(names)):
                raise ValueError(f"tenant {tenant}: endpoint names must be unique")
        return self


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """A usable endpoint: its secret read (kept in memory only, never logged or published)."""

    tenant: str
    name: str
    url: str
    secret: bytes
    kinds: frozenset[DecisionKind]

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"Endpoint(tenant={self.tenant!r}, name={self.name!r}, kinds={sorted(self.kinds)})"


@dataclass(frozen=True)
class Directory:
    """Every tenant's endpoints."""

    by_tenant: Mapping[str, tuple[Endpoint, ...]]

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted(t for t, endpoints in self.by_tenant.items() if endpoints))

    def endpoint(self, tenant: str, name: str) -> Endpoint | None:
        return next((e for e in self.by_tenant.get(tenant, ()) if e.name == name), None)


def parse_endpoints(text: str, *, toml: bool = False) -> EndpointsFile:
    """The endpoints file's declarations (JSON, or TOML when ``toml``)."""
    try:
        data: Any = tomllib.loads(text) if toml else json.loads(text)
        return EndpointsFile.model_validate(data)
    except (ValueError, tomllib.TOMLDecodeError) as exc:  # ValidationError is a ValueError
        raise ConfigurationError(f"notification endpoints file: {exc}") from exc


def resolve_secrets(
    declared: EndpointsFile, *, environ: Mapping[str, str], base: Path | None = None
) -> Directory:
    """The declared endpoints with their secrets read from the environment or from files (a
    relative ``secret_file`` is relative to ``base``). A missing or empty secret is a
    configuration error: an unsigned notification is never sent."""
    by_tenant: dict[str, tuple[Endpoint, ...]] = {}
    for tenant, specs in declared.tenants.items():
        endpoints = []
        for spec in specs:
            where = f"tenant {tenant}, endpoint {spec.name}"
            if spec.secret_env is not None:
                secret = environ.get(spec.secret_env, "")
                if not secret:
                    raise ConfigurationError(f"{where}: ${spec.secret_env} is not set")
                raw = secret.encode()
            else:
                assert spec.secret_file is not None
                path = Path(spec.secret_file)
                if not path.is_absolute() and base is not None:
                    path = base / path
                try:
                    raw = path.read_bytes().strip()
                except OSError as exc:
                    raise ConfigurationError(f"{where}: secret file unreadable") from exc
                if not raw:
                    raise ConfigurationError(f"{where}: secret file is empty")
            endpoints.append(
                Endpoint(
                    tenant=tenant,
                    name=spec.name,
                    url=spec.url,
                    secret=raw,
                    kinds=frozenset(spec.kinds),
                )
            )
        by_tenant[tenant] = tuple(endpoints)
    return Directory(by_tenant)


def load_directory(path: str | None, environ: Mapping[str, str] | None = None) -> Directory:
    """The endpoints declared in the file at ``path`` (``.toml``: TOML, else JSON); no file:
    no endpoints."""
    if path is None:
        return Directory({})
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"notification endpoints file {path} unreadable") from exc
    declared = parse_endpoints(text, toml=file.suffix == ".toml")
    return resolve_secrets(
        declared, environ=os.environ if environ is None else environ, base=file.parent
    )


# -- deliveries ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """One notification owed to one endpoint: what the outbox stores."""

    delivery_id: str
    tenant: str
    call_id: str
    endpoint: str
    kind: DecisionKind
    body: bytes
    expires_at: datetime


def delivery_id(request: ApprovalRequest, endpoint: str, kind: DecisionKind) -> str:
    """Stable per (request, endpoint, kind): a redelivered request, a retry and a restart all
    give the same id, which the receiver deduplicates on. The fingerprint is part of the
    request's identity (an edited call is a new request)."""
    material = "\0".join(
        (request.tenant, request.call_id, request.fingerprint, endpoint, kind.value)
    )
    return "dlv_" + hashlib.sha256(material.encode()).hexdigest()[:32]


def decide_link(dashboard_url: str, call_id: str) -> str:
    """Where a human decides on the call (the dashboard's inbox, the call preselected)."""
    return f"{dashboard_url.rstrip('/')}/?call={quote(call_id, safe='')}"


def payload(
    request: ApprovalRequest, *, kind: DecisionKind, delivery: str, dashboard_url: str
) -> dict[str, Any]:
    """What the receiver gets: the request's identity, its preview and bounds, and a link to
    decide. Built field by field from what is safe to show (never the arguments, the
    requester's context, a token, key or secret)."""
    return {
        "type": "approval.requested" if kind is DecisionKind.APPROVER else "confirmation.requested",
        "delivery_id": delivery,
        "kind": kind.value,
        "call_id": request.call_id,
        "tenant": request.tenant,
        "tool": request.tool,
        "effect": request.effect.value,
        "preview": list(request.preview),
        "expires_at": request.expires_at.isoformat(),
        "required_approvals": request.required_approvals,
        "subject": request.subject,
        "decide_url": decide_link(dashboard_url, request.call_id),
    }


def body_of(document: Mapping[str, Any]) -> bytes:
    """The exact bytes sent (and signed): compact JSON, keys sorted."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def kinds_for(request: ApprovalRequest) -> tuple[DecisionKind, ...]:
    """Who is asked: approvers always; the subject too when the request names one."""
    if request.subject:
        return (DecisionKind.APPROVER, DecisionKind.CONFIRMATION)
    return (DecisionKind.APPROVER,)


def deliveries_for(
    request: ApprovalRequest, directory: Directory, *, dashboard_url: str
) -> list[Delivery]:
    """Every notification ``request`` owes: one per endpoint of its tenant and kind."""
    owed = []
    for kind in kinds_for(request):
        for endpoint in directory.by_tenant.get(request.tenant, ()):
            if kind not in endpoint.kinds:
                continue
            ident = delivery_id(request, endpoint.name, kind)
            document = payload(request, kind=kind, delivery=ident, dashboard_url=dashboard_url)
            owed.append(
                Delivery(
                    delivery_id=ident,
                    tenant=request.tenant,
                    call_id=request.call_id,
                    endpoint=endpoint.name,
                    kind=kind,
                    body=body_of(document),
                    expires_at=request.expires_at,
                )
            )
    return owed


# -- signatures ---------------------------------------------------------------------------


def _mac(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The signature header's value: ``t=<unix seconds>,v1=<hex HMAC-SHA256>``."""
    return f"t={timestamp},{SIGNATURE_SCHEME}={_mac(secret, timestamp, body)}"


def signature_problem(
    secret: bytes | str,
    header: str | None,
    body: bytes,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
) -> str | None:
    """Why ``header`` does not sign ``body`` with ``secret`` at ``now`` (None: it does). Any
    one ``v1`` entry may match (several during a secret rotation)."""
    if not header:
        return "no signature"
    key = secret.encode() if isinstance(secret, str) else secret
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                return "malformed timestamp"
        elif name == SIGNATURE_SCHEME:
            candidates.append(value)
    if timestamp is None or not candidates:
        return "malformed signature header"
    if abs(now - timestamp) > tolerance:
        return "timestamp outside the replay window"
    expected = _mac(key, timestamp, body)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        return "signature mismatch"
    return None


def verify_signature(
    secret: bytes | str,
    header: str | None,
    body: bytes,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
) -> bool:
    """True when ``header`` (``Ratifier-Signature``) signs ``body`` with ``secret`` and its
    timestamp is within ``tolerance`` seconds of ``now``: what a receiver checks before it
    trusts a notification (and, by its ``Ratifier-Delivery`` id, before it acts twice)."""
    return signature_problem(secret, header, body, now=now, tolerance=tolerance) is None


# -- retries and dead letters ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """The retry schedule and the dead-letter bound (settings ``notifications``)."""

    backoff_seconds: float
    backoff_cap_seconds: float
    max_attempts: int
    max_age_seconds: float

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1-based): doubling from
        ``backoff_seconds``, capped."""
        exponent = max(attempts - 1, 0)
        return float(min(self.backoff_seconds * 2 ** min(exponent, 62), self.backoff_cap_seconds))

    def schedule(self) -> list[float]:
        """Every wait before the bound: what docs/notifications.md shows."""
        return [self.backoff(n) for n in range(1, self.max_attempts)]


@dataclass(frozen=True, kw_only=True)
class AfterFailure:
    """What a failed attempt leads to: another attempt at ``retry_at``, or the dead letter."""

    dead: bool
    retry_at: datetime | None


def after_failure(
    policy: RetryPolicy, *, attempts: int, queued_at: datetime, now: datetime
) -> AfterFailure:
    """The decision after attempt number ``attempts`` failed: dead when the attempts are
    spent, or when the next attempt would come after the age bound."""
    if attempts >= policy.max_attempts:
        return AfterFailure(dead=True, retry_at=None)
    retry_at = now + timedelta(seconds=policy.backoff(attempts))
    if retry_at - queued_at > timedelta(seconds=policy.max_age_seconds):
        return AfterFailure(dead=True, retry_at=None)
    return AfterFailure(dead=False, retry_at=retry_at)


def short_error(text: str, *, url: str = "", name: str = "endpoint") -> str:
    """A failure's description as stored and dead-lettered: one line, bounded, with the
    endpoint's URL (and its path and query) replaced by its name: a webhook URL may itself be
    a credential (a chat hook's, say), and nothing stored or published may carry one."""
    if url:
        parts = urlsplit(url)
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        for secret_part in (url, tail if len(tail) > 1 else ""):
            if secret_part:
                text = text.replace(secret_part, f"<{name}>")
    return " ".join(text.split())[:MAX_ERROR_CHARS]
