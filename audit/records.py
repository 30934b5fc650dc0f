"""One Kafka record → one `audit_records` row. Pure: every input, however broken, yields
exactly one row (unreadable input is kept as its hash and size, never in clear)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from audit.masking import Masker, reject_constant
from schemas.errors import ErrorCode
from schemas.names import TRACEPARENT_HEADER, Topic

# Derived text columns are indexed or shown in lists: long garbage is cut, never refused.
_MAX_COLUMN = 200
_MAX_KEY = 1024


@dataclass(frozen=True, kw_only=True)
class KafkaRecord:
    """What the sink needs of a consumed record (decoupled from aiokafka's type)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True, kw_only=True)
class AuditRow:
    topic: str
    kafka_partition: int
    kafka_offset: int
    prefix: str
    stream: str
    record_key: str | None
    call_id: str | None
    tenant: str | None
    tool: str | None
    status: str | None
    error_code: str | None
    trace_id: str | None
    record_at: datetime
    record: str  # JSON text of the masked record (valid for jsonb)

    def params(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "kafka_partition": self.kafka_partition,
            "kafka_offset": self.kafka_offset,
            "prefix": self.prefix,
            "stream": self.stream,
            "record_key": self.record_key,
            "call_id": self.call_id,
            "tenant": self.tenant,
            "tool": self.tool,
            "status": self.status,
            "error_code": self.error_code,
            "trace_id": self.trace_id,
            "record_at": self.record_at,
            "record": self.record,
        }


def unparseable(raw: bytes | None) -> dict[str, Any]:
    data = raw or b""
    return {"unparseable": True, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _text(value: Any, limit: int = _MAX_COLUMN) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value.replace("\x00", "\ufffd")[:limit]


def _parse(raw: bytes | None, max_bytes: int) -> dict[str, Any] | None:
    if raw is None or len(raw) > max_bytes:
        return None
    try:
        body = json.loads(raw, parse_constant=reject_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return body if isinstance(body, dict) else None


def _jsonb_text(value: Any) -> str | None:
    """JSON text PostgreSQL's jsonb accepts: no NUL characters, valid UTF-8 (no lone
    surrogates); None when ``value`` cannot be stored as is."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    return None if "\x00" in text or "\\u0000" in text else text


def _dead_letter_raw(masker: Masker, body: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """A dead letter's raw payload is the agent's input: kept parsed and masked when it is a
    JSON object, else only as hash and size. The base64 copy never reaches the store."""
    encoded = body.get("raw_base64")
    if not isinstance(encoded, str):
        return body
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raw = encoded.encode("utf-8", errors="replace")
    kept = {k: v for k, v in body.items() if k != "raw_base64"}
    parsed = _parse(raw, max_bytes)
    digest = unparseable(raw)
    kept.update(
        raw_sha256=digest["sha256"],
        raw_bytes=digest["bytes"],
        raw=masker.mask(parsed) if parsed is not None else None,
    )
    return kept


def _trace_id(body: dict[str, Any], headers: Sequence[tuple[str, bytes]]) -> str | None:
    found = _text(body.get("trace_id"), 64)
    if found:
        return found
    for name, value in headers:
        if name == TRACEPARENT_HEADER:
            parts = bytes(value).decode("ascii", errors="replace").split("-")
            if len(parts) == 4 and len(parts[1]) == 32:
                return parts[1]
    return None


def _tool(body: dict[str, Any]) -> str | None:
    tool = _text(body.get("tool"))
    if tool:
        return tool
    call = body.get("call")  # provider formats: OpenAI function.name, Anthropic/MCP name
    if isinstance(call, dict):
        function = call.get("function")
        if isinstance(function, dict):
            return _text(function.get("name"))
        return _text(call.get("name"))
    return None


def _tenant(stream: Topic | None, body: dict[str, Any]) -> str | None:
    tenant = _text(body.get("tenant"), 64)
    if tenant:
        return tenant
    if stream is Topic.CONTROLS:  # a freeze (the kill switch): the tenant of its scope
        parts = str(body.get("scope", "")).split(":")
        return _text(parts[1], 64) if len(parts) > 1 else None
    # Proposals and validated calls carry the tenant only in their signed context.
    context = body.get("context")
    verified = isinstance(context, dict) and context.get("verified") is True
    if stream in (Topic.PROPOSED, Topic.VALIDATED) and verified:
        assert isinstance(context, dict)
        return _text(context.get("tenant"), 64)
    return None


def _error_code(stream: Topic | None, body: dict[str, Any]) -> str | None:
    if stream is Topic.DEADLETTER:
        return ErrorCode.MALFORMED.value
    error = body.get("error")
    return _text(error.get("code"), 64) if isinstance(error, dict) else None


def stream_of(topic: str, prefix: str) -> Topic | None:
    if not topic.startswith(prefix):
        return None
    try:
        return Topic(topic.removeprefix(prefix))
    except ValueError:
        return None


def audit_row(record: KafkaRecord, *, prefix: str, masker: Masker, max_bytes: int) -> AuditRow:
    """The masked, indexed row for one consumed record."""
    stream = stream_of(record.topic, prefix)
    body = _parse(record.value, max_bytes)
    masked: dict[str, Any] | None = None
    if body is not None:
        try:
            if stream is Topic.POLICIES:
                masked = body  # policy sets carry no arguments or tokens
            else:
                masked = masker.mask(
                    _dead_letter_raw(masker, body, max_bytes)
                    if stream is Topic.DEADLETTER
                    else body
                )
        except RecursionError:
            masked = None
    text = _jsonb_text(masked) if masked is not None else None
    if masked is None or text is None:
        masked = {}
        text = json.dumps(unparseable(record.value))
    key = record.key.decode("utf-8", errors="replace") if record.key is not None else None
    return AuditRow(
        topic=record.topic,
        kafka_partition=record.partition,
        kafka_offset=record.offset,
        prefix=prefix,
        stream=stream.value if stream is not None else record.topic.removeprefix(prefix),
        record_key=_text(key, _MAX_KEY),
        call_id=_text(masked.get("call_id")),
        tenant=_tenant(stream, masked),
        tool=_tool(masked),
        status=_text(masked.get("status"), 64) if stream is Topic.OUTCOMES else None,
        error_code=_error_code(stream, masked),
        trace_id=_trace_id(masked, record.headers),
        record_at=datetime.fromtimestamp(max(record.timestamp_ms, 0) / 1000, tz=UTC),
        record=text,
    )
