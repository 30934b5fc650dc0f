"""The faust app: wires the pure stages to topics. All I/O of the stream side lives here.

Faust gives at-least-once delivery: it flushes the producer before committing offsets, and
every stage is idempotent by `call_id`, so a redelivered record is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import faust
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from commands.catalog import Catalog, Resource, Tool, ToolArguments
from commands.policy import PolicySet
from commands.validate import Limits
from schemas.envelopes import AuthorizedCall, SourcePosition, ValidatedCall
from schemas.errors import ConfigurationError, StorageUnavailable
from schemas.identity import context_keys
from schemas.names import STREAMS_APP_ID, TRACEPARENT_HEADER, Topic
from schemas.settings import Settings
from streams.approval import on_authorized
from streams.authorizer import on_validated
from streams.emit import Emit
from streams.validator import dead_letter, on_proposed

log = logging.getLogger("ratifier.streams")

STAGES = frozenset({"validator", "authorizer", "approval-join"})
STORAGE_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


def _text_key(key: bytes | None) -> str | None:
    return key.decode(errors="replace")[:256] if key else None


def limits_from(settings: Settings) -> Limits:
    return Limits(
        max_record_bytes=settings.max_record_bytes,
        max_nesting_depth=settings.max_nesting_depth,
        max_string_length=settings.max_string_length,
    )


def trace_id_from(headers: Any) -> str:
    """The trace id of a W3C `traceparent` header, or a new one."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    for name, value in items:
        if name == TRACEPARENT_HEADER and isinstance(value, bytes | str):
            text = value.decode() if isinstance(value, bytes) else value
            parts = text.split("-")
            if len(parts) == 4 and len(parts[1]) == 32:
                return parts[1]
    return uuid.uuid4().hex


class ResourceStore:
    """Loads resources for the authorizer from PostgreSQL (pool opened on first use)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._pool: AsyncConnectionPool[Any] | None = None
        self._lock = asyncio.Lock()

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        async with self._lock:
            if self._pool is None:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self._url,
                    min_size=1,
                    max_size=4,
                    open=False,
                    kwargs={"row_factory": dict_row, "autocommit": True},
                )
                await pool.open(wait=True, timeout=30)
                self._pool = pool
            return self._pool

    async def fetch(self, tool: Tool, tenant: str, arguments: ToolArguments) -> Resource | None:
        if tool.load is None:
            return None
        pool = await self._get_pool()
        try:
            async with pool.connection() as conn:
                return await tool.load(conn, tenant, arguments, False)
        except Exception as exc:
            if _is_storage_error(exc):
                raise StorageUnavailable() from exc
            raise

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def _is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | PoolTimeout)


async def with_storage_retry(step: Callable[[], Awaitable[tuple[Emit, ...]]]) -> tuple[Emit, ...]:
    """Retry a stage while storage is unreachable: the record waits, it is never dropped."""
    attempt = 0
    while True:
        try:
            return await step()
        except StorageUnavailable:
            delay = STORAGE_RETRY_SECONDS[min(attempt, len(STORAGE_RETRY_SECONDS) - 1)]
            attempt += 1
            log.warning("storage unavailable; retrying in %.1fs (attempt %d)", delay, attempt)
            await asyncio.sleep(delay)


def create_app(
    settings: Settings, *, catalog: Catalog, policies: PolicySet, **faust_options: Any
) -> faust.App:
    """A faust app with the validator, authorizer and approval-join agents."""
    app = faust.App(
        settings.group(STREAMS_APP_ID),
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=1,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        **faust_options,
    )
    limits = limits_from(settings)
    keys = context_keys(settings)
    store = ResourceStore(settings.database_url)
    topics = {
        t: app.topic(settings.topic(t), key_type=bytes, value_type=bytes, internal=False)
        for t in Topic
    }

    async def publish(emits: tuple[Emit, ...], trace_id: str | None) -> None:
        headers = (
            {TRACEPARENT_HEADER: f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01".encode()}
            if trace_id
            else None
        )
        for emit in emits:
            await topics[emit.topic].send(
                key=emit.key.encode() if emit.key is not None else None,
                value=emit.value.to_bytes(),
                headers=headers,
            )

    def position(event: Any) -> SourcePosition:
        message = event.message
        return SourcePosition(
            topic=message.topic, partition=message.partition, offset=message.offset
        )

    async def contain(
        event: Any, stage: str, step: Callable[[], Awaitable[tuple[Emit, ...]]], trace_id: str
    ) -> None:
        """Run one record through a stage; a bug in a stage dead-letters that record only."""
        try:
            emits = await with_storage_retry(step)
        except (ValidationError, ValueError) as exc:
            log.warning("%s: unreadable record at %s: %s", stage, position(event), exc)
            emits = (
                dead_letter(
                    event.value,
                    reason=f"{stage}: unreadable record",
                    call_id=None,
                    source=position(event),
                    at=datetime.now(UTC),
                    key=_text_key(event.key),
                ),
            )
        except Exception:
            log.exception("%s: internal error at %s", stage, position(event))
            emits = (
                dead_letter(
                    event.value,
                    reason=f"{stage}: internal error",
                    call_id=None,
                    source=position(event),
                    at=datetime.now(UTC),
                    key=_text_key(event.key),
                ),
            )
        await publish(emits, trace_id)

    stages = settings.stream_stages
    unknown = stages - STAGES
    if unknown:
        raise ConfigurationError(
            f"unknown stream stages {sorted(unknown)}; known: {sorted(STAGES)}"
        )

    async def validator(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            trace_id = trace_id_from(event.message.headers)

            async def step(event: Any = event, trace_id: str = trace_id) -> tuple[Emit, ...]:
                return on_proposed(
                    event.value,
                    source=position(event),
                    key=_text_key(event.key),
                    catalog=catalog,
                    limits=limits,
                    now=datetime.now(UTC),
                    trace_id=trace_id,
                )

            await contain(event, "validator", step, trace_id)

    async def authorizer(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            trace_id = trace_id_from(event.message.headers)

            async def step(event: Any = event) -> tuple[Emit, ...]:
                call = ValidatedCall.model_validate_json(event.value)
                return await on_validated(
                    call,
                    catalog=catalog,
                    keys=keys,
                    policies=policies,
                    fetch=store.fetch,
                    now=datetime.now(UTC),
                )

            await contain(event, "authorizer", step, trace_id)

    async def approval_join(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            trace_id = trace_id_from(event.message.headers)

            async def step(event: Any = event) -> tuple[Emit, ...]:
                call = AuthorizedCall.model_validate_json(event.value)
                return on_authorized(call, tool=catalog.get(call.tool), now=datetime.now(UTC))

            await contain(event, "approval-join", step, trace_id)

    agents = {
        "validator": (Topic.PROPOSED, validator),
        "authorizer": (Topic.VALIDATED, authorizer),
        "approval-join": (Topic.AUTHORIZED, approval_join),
    }
    for name, (source, agent) in agents.items():
        if name in stages:
            app.agent(topics[source], name=name)(agent)

    async def _close_store(_app: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        await store.close()

    app.on_before_shutdown.connect(_close_store)

    return app
