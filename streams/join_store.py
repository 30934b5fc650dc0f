"""The approval-join's storage (PostgreSQL): approval states, the applied offset of each
source partition, and the outbox of records to publish; the join's audit rows and the ends of
approval requests go in the same transactions. The SQL is in streams/sql/join_*.sql; the
service that drives it is streams/join_service.py, the decisions are streams/approval.py's.

A batch is one transaction (:meth:`JoinStore.transaction`): lock the batch's partitions'
applied offsets (records below are redeliveries: skipped), lock its call ids (advisory locks:
the other topic's records and the timer of a call may be on another worker), read their
states, and — after the caller decided — write the new states, the audit rows, the ends of
requests, the outbox rows and the offsets, then commit. Nothing of a batch is half written.

The outbox rows a transaction wrote are then taken (:meth:`JoinStore.take`): deleted in a
transaction held open until the broker has acknowledged the records (:meth:`Taken.clear`
commits), or given back (:meth:`Taken.abandon`, or the worker's death: PostgreSQL rolls it
back). Rows left behind are taken by any worker of the deployment (:meth:`JoinStore.orphans`),
skipping rows a live worker holds: each record is published by one worker at a time, and
again only when the worker that published it died before it cleared it.

Every row is scoped by the deployment (the topic prefix), as the consumer groups are.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from commands.sql import named_query
from schemas.envelopes import (
    ApprovalRequest,
    AuthorizedCall,
    CommittedCommand,
    DeadLetter,
    Outcome,
    Record,
)
from schemas.errors import StorageUnavailable
from schemas.names import Topic
from streams.approval import TERMINAL_PHASES, ApprovalState, AuditEntry, EndedRequest, Phase
from streams.emit import Emit

_PKG = "streams"

# The record types the join publishes, by topic: an orphaned outbox row is read back as one.
_RECORDS: dict[Topic, type[Record]] = {
    Topic.APPROVALS_REQUESTED: ApprovalRequest,
    Topic.COMMITTED: CommittedCommand,
    Topic.OUTCOMES: Outcome,
    Topic.DEADLETTER: DeadLetter,
    Topic.AUTHORIZED: AuthorizedCall,
}


def lock_key(deployment: str, call_id: str) -> int:
    """The advisory lock of one call id of one deployment (a signed 64-bit key)."""
    digest = hashlib.blake2b(f"{deployment}\0{call_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def due_at(state: ApprovalState) -> datetime | None:
    """When the timer acts on ``state`` next (streams/approval.py's ``due``)."""
    if state.phase is Phase.PENDING:
        return state.expires_at
    if state.phase is Phase.HELD:
        return state.held_until
    return state.forget_at if state.phase in TERMINAL_PHASES else None


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a call's record with its real arguments is on Kafka: its `calls.authorized`
    record (``kind="call"``), or the faust join's changelog record of its state
    (``kind="state"``, a state migrated from it)."""

    topic: str
    partition: int
    offset: int
    kind: Literal["call", "state"] = "call"


# Per call id of a state: where its secret arguments can be read back (streams/join_secrets.py).
Sources = Mapping[str, Source]


@dataclass(frozen=True, kw_only=True)
class Publish:
    """One record a state change publishes, with the call it belongs to and the
    `traceparent` of the join's hop that produced it."""

    emit: Emit
    call_id: str | None
    traceparent: bytes | None


@dataclass(frozen=True, kw_only=True)
class Audit:
    """One audit row, with the key that makes it once per source record."""

    entry: AuditEntry
    event_key: str


@dataclass(frozen=True, kw_only=True)
class Changes:
    """What one transaction writes: each changed call's new state (None: forgotten), audit
    rows, requests that ended without their command running, records to publish, and the
    next offset of each source partition."""

    states: Mapping[str, ApprovalState | None]
    sources: Mapping[str, Sources] = field(default_factory=dict)
    audits: Sequence[Audit] = ()
    ended: Sequence[EndedRequest] = ()
    publish: Sequence[Publish] = ()
    positions: Mapping[tuple[str, int], int] | None = None


def stored_state(raw: Any) -> ApprovalState | None:
    """A stored state (its JSON, as read), or None when this version cannot read it."""
    try:
        return ApprovalState.model_validate(raw)
    except ValidationError:
        return None


class JoinTransaction:
    """One transaction of the join (see the module docstring)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], deployment: str) -> None:
        self._conn = conn
        self._deployment = deployment
        # Of each state read: where its calls' secret arguments are (empty: none kept).
        self.sources: dict[str, Sources] = {}

    async def lock_positions(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """Lock the applied offsets of ``partitions`` ((topic, partition)); how far each is
        applied (records below are redeliveries)."""
        if not partitions:
            return {}
        ordered = sorted(set(partitions))
        async with self._conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "join_lock_positions"),
                {
                    "deployment": self._deployment,
                    "topics": [t for t, _ in ordered],
                    "partitions": [p for _, p in ordered],
                },
            )
            rows = await cur.fetchall()
        return {(r["topic"], int(r["partition"])): int(r["next_offset"]) for r in rows}

    async def lock(
        self, partitions: Sequence[tuple[str, int]], call_ids: Sequence[str]
    ) -> tuple[dict[tuple[str, int], int], dict[str, ApprovalState | None]]:
        """``lock_positions`` and ``lock_calls`` in one round trip (pipelined)."""
        ordered = sorted(set(partitions))
        unique = sorted(set(call_ids))
        keys = sorted({lock_key(self._deployment, c) for c in unique})
        async with (
            self._conn.pipeline(),
            self._conn.cursor() as positions,
            self._conn.cursor() as states,
        ):
            if ordered:
                await positions.execute(
                    named_query(_PKG, "join_lock_positions"),
                    {
                        "deployment": self._deployment,
                        "topics": [t for t, _ in ordered],
                        "partitions": [p for _, p in ordered],
                    },
                )
            if unique:
                await states.execute(named_query(_PKG, "join_lock_calls"), {"keys": keys})
                await states.execute(
                    named_query(_PKG, "join_states"),
                    {"deployment": self._deployment, "call_ids": unique},
                )
            applied = await positions.fetchall() if ordered else []
            rows = await states.fetchall() if unique else []
        found: dict[str, ApprovalState | None] = dict.fromkeys(unique)
        for row in rows:
            found[row["call_id"]] = stored_state(row["state"])
            self.sources[row["call_id"]] = _sources(row["sources"])
        return {(r["topic"], int(r["partition"])): int(r["next_offset"]) for r in applied}, found

    async def lock_calls(self, call_ids: Sequence[str]) -> dict[str, ApprovalState | None]:
        """Lock ``call_ids`` for this transaction and read their states (None: none, or one
        this version cannot read)."""
        unique = sorted(set(call_ids))
        if not unique:
            return {}
        keys = sorted({lock_key(self._deployment, c) for c in unique})
        async with self._conn.cursor() as cur:
            await cur.execute(named_query(_PKG, "join_lock_calls"), {"keys": keys})
            await cur.execute(
                named_query(_PKG, "join_states"),
                {"deployment": self._deployment, "call_ids": unique},
            )
            rows = await cur.fetchall()
        found: dict[str, ApprovalState | None] = dict.fromkeys(unique)
        for row in rows:
            found[row["call_id"]] = stored_state(row["state"])
            self.sources[row["call_id"]] = _sources(row["sources"])
        return found

    async def write(self, changes: Changes) -> list[int]:
        """Write ``changes`` (pipelined: one round trip); the ids of the outbox rows, in the
        order of ``changes.publish``."""
        deployment = self._deployment
        saved = [s for s in changes.states.values() if s is not None]
        gone = [c for c, s in changes.states.items() if s is None]
        ids: list[int] = []
        async with (
            self._conn.pipeline(),
            self._conn.cursor() as cur,
            self._conn.cursor() as outbox,
        ):
            if saved:
                await cur.execute(
                    named_query(_PKG, "join_save_states"),
                    {
                        "deployment": deployment,
                        "rows": _json(
                            [_state_row(s, changes.sources.get(s.call_id, {})) for s in saved]
                        ),
                    },
                )
            if gone:
                await cur.execute(
                    named_query(_PKG, "join_forget_states"),
                    {"deployment": deployment, "call_ids": gone},
                )
            if changes.audits:
                await cur.execute(
                    named_query(_PKG, "insert_audit_rows"), audit_rows(changes.audits)
                )
            for request in changes.ended:
                call = request.call
                await cur.execute(
                    named_query(_PKG, "end_approval_request"),
                    {
                        "tenant": call.tenant,
                        "idempotency_key": call.idempotency_key,
                        "call_id": call.call_id,
                        "outcome": Jsonb(request.outcome.model_dump(mode="json")),
                    },
                )
            if changes.positions:
                ordered = sorted(changes.positions.items())
                await cur.execute(
                    named_query(_PKG, "join_advance_positions"),
                    {
                        "deployment": deployment,
                        "topics": [t for (t, _), _ in ordered],
                        "partitions": [p for (_, p), _ in ordered],
                        "next_offsets": [n for _, n in ordered],
                    },
                )
            if changes.publish:
                await outbox.execute(
                    named_query(_PKG, "join_outbox_insert"),
                    {
                        "deployment": deployment,
                        "call_ids": [p.call_id for p in changes.publish],
                        "topics": [p.emit.topic.value for p in changes.publish],
                        "keys": [p.emit.key for p in changes.publish],
                        "values": [p.emit.value.to_bytes() for p in changes.publish],
                        "traceparents": [p.traceparent for p in changes.publish],
                    },
                )
                ids = [int(r["id"]) for r in await outbox.fetchall()]
        return ids


def _json(value: Any) -> Jsonb:
    """A jsonb parameter dumped by orjson (with pre-serialized fragments kept as they are)."""
    return Jsonb(value, dumps=orjson.dumps)


def _state_row(state: ApprovalState, sources: Sources) -> dict[str, Any]:
    call = state.authorized
    due = due_at(state)
    return {
        "call_id": state.call_id,
        "tenant": call.tenant if call is not None else None,
        "phase": state.phase.value,
        "due_at": due.isoformat() if due is not None else None,
        "state": orjson.Fragment(state.model_dump_json()),
        "sources": {c: asdict(where) for c, where in sources.items()},
    }


def _sources(raw: Any) -> dict[str, Source]:
    if not isinstance(raw, dict):
        return {}
    found = {}
    for call_id, where in raw.items():
        try:
            found[call_id] = Source(**where)
        except TypeError:
            continue
    return found


def audit_rows(audits: Sequence[Audit]) -> dict[str, Any]:
    """The parameters of streams/sql/insert_audit_rows.sql for ``audits``."""
    return {"rows": _json([_audit_row(a) for a in audits])}


def _audit_row(audit: Audit) -> dict[str, Any]:
    entry = audit.entry
    return {
        "tenant": entry.tenant,
        "call_id": entry.call_id,
        "kind": entry.kind.value,
        "detail": entry.detail,
        "event_key": audit.event_key,
    }


@dataclass(frozen=True, kw_only=True)
class Orphan:
    """An outbox row left by a worker that did not publish it."""

    call_id: str | None
    emit: Emit
    traceparent: bytes | None


class Taken:
    """Outbox rows deleted in a transaction held open while their records are published:
    :meth:`clear` commits (they are gone), :meth:`abandon` rolls back (they stay)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        conn: psycopg.AsyncConnection[Any] | None,
        ids: Sequence[int],
    ) -> None:
        self._pool = pool
        self._conn = conn
        self.ids = tuple(ids)

    async def clear(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.commit()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            # The records are published: left in the outbox, they are published again.
            raise StorageUnavailable() from exc
        finally:
            await _put_back(self._pool, conn)

    async def abandon(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(psycopg.Error):
            await conn.rollback()
        await _put_back(self._pool, conn)


async def _put_back(pool: AsyncConnectionPool[Any], conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(psycopg.Error, PoolTimeout):
        await pool.putconn(conn)


class JoinStore:
    """The join's tables of one deployment (``deployment``: its topic prefix)."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, deployment: str) -> None:
        self._pool = pool
        self.deployment = deployment

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[JoinTransaction]:
        """One transaction (committed when the block ends, rolled back if it raises); the
        database away: StorageUnavailable."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                yield JoinTransaction(conn, self.deployment)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StorageUnavailable() from exc

    async def take(self, ids: Sequence[int]) -> Taken:
        """Take the outbox rows ``ids`` (just written by this worker) to publish them; the
        rows another worker took meanwhile are not among :attr:`Taken.ids`."""
        if not ids:
            return Taken(self._pool, None, ())
        conn = await self._getconn()
        try:
            async with conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "join_outbox_take"),
                    {"deployment": self.deployment, "ids": list(ids)},
                )
                taken = sorted(int(r["id"]) for r in await cur.fetchall())
        except BaseException as exc:
            await Taken(self._pool, conn, ()).abandon()
            if isinstance(exc, psycopg.OperationalError):
                raise StorageUnavailable() from exc
            raise
        return Taken(self._pool, conn, taken)

    async def orphans(self, *, age_seconds: float, limit: int) -> tuple[Taken, list[Orphan]]:
        """Take up to ``limit`` outbox rows older than ``age_seconds`` that no live worker
        holds, oldest first, to publish them."""
        conn = await self._getconn()
        try:
            async with conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "join_outbox_orphans"),
                    {"deployment": self.deployment, "age": age_seconds, "limit": limit},
                )
                rows = await cur.fetchall()
        except BaseException as exc:
            await Taken(self._pool, conn, ()).abandon()
            if isinstance(exc, psycopg.OperationalError):
                raise StorageUnavailable() from exc
            raise
        rows.sort(key=lambda r: int(r["id"]))
        found = [
            Orphan(
                call_id=r["call_id"],
                emit=_emit_of(Topic(r["topic"]), r["key"], bytes(r["value"])),
                traceparent=bytes(r["traceparent"]) if r["traceparent"] is not None else None,
            )
            for r in rows
        ]
        if not found:
            await Taken(self._pool, conn, ()).abandon()
            return Taken(self._pool, None, ()), []
        return Taken(self._pool, conn, [int(r["id"]) for r in rows]), found

    async def due(self, now: datetime, *, limit: int) -> list[str]:
        """Call ids whose state is due at ``now``, soonest first."""
        try:
            async with self._pool.connection() as conn, conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "join_due"),
                    {"deployment": self.deployment, "now": now, "limit": limit},
                )
                rows = await cur.fetchall()
                await conn.commit()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StorageUnavailable() from exc
        return [r["call_id"] for r in rows]

    async def adopt(self, states: Sequence[tuple[ApprovalState, Sources]]) -> int:
        """Keep ``states`` (read from the former faust join's changelog, on an upgrade; with
        where their secret arguments are), each unless the join already has a state for its
        call; how many were kept."""
        kept = 0
        try:
            async with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                for state, sources in states:
                    row = _state_row(state, sources)
                    row["state"] = _json(row["state"])
                    row["sources"] = _json(row["sources"])
                    await cur.execute(
                        named_query(_PKG, "join_import_state"),
                        {"deployment": self.deployment, **row},
                    )
                    kept += len(await cur.fetchall())
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StorageUnavailable() from exc
        return kept

    async def _getconn(self) -> psycopg.AsyncConnection[Any]:
        try:
            conn: psycopg.AsyncConnection[Any] = await self._pool.getconn()
        except PoolTimeout as exc:
            raise StorageUnavailable() from exc
        return conn


def _emit_of(topic: Topic, key: str | None, value: bytes) -> Emit:
    return Emit(topic=topic, key=key, value=_RECORDS[topic].model_validate_json(value))
