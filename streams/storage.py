"""PostgreSQL for the stream side: tenant-scoped resource loads for the authorizer and the
approval-join, the authorizer's view of budgets and repeats. The pool opens on first use.
(The approval-join's own tables are streams/join_store.py's.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from commands.catalog import Resource, Tool, ToolArguments, load_resources
from commands.sql import named_query
from runtime.clients import pg_pool
from schemas.envelopes import Actor, AuthorizedCall
from schemas.errors import StorageUnavailable
from streams.budget_view import WindowAsk
from streams.join_store import Audit, audit_rows
from streams.repeats import OperationSeen

_PKG = "streams"
T = TypeVar("T")


class StreamStorage:
    def __init__(self, database_url: str, *, max_size: int = 8) -> None:
        self._url = database_url
        self._max_size = max_size
        self._pool: AsyncConnectionPool[Any] | None = None
        self._lock = asyncio.Lock()

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        async with self._lock:
            if self._pool is None:
                # Every connection opened now, not one by one under the first burst of
                # calls (each connection's authentication costs milliseconds of CPU).
                pool = pg_pool(
                    self._url,
                    max_size=self._max_size,
                    min_size=self._max_size,
                    dict_rows=True,
                    autocommit=True,
                )
                try:
                    await pool.open(wait=True, timeout=30)
                except PoolTimeout as exc:
                    raise StorageUnavailable() from exc
                self._pool = pool
            return self._pool

    async def _with_connection(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a pooled connection. A connection found dead (idle reaper, NAT
        timeout, server restart) makes every pooled one suspect, since they idled as long:
        the whole pool is checked at once and ``work`` retried once, instead of one dead
        connection discarded per retry and its backoff (tens of seconds for a full pool)."""
        pool = await self._get_pool()
        for attempt in (1, 2):
            try:
                async with pool.connection() as conn:
                    return await work(conn)
            except psycopg.OperationalError as exc:
                if attempt == 2:
                    raise StorageUnavailable() from exc
                await pool.check()
            except PoolTimeout as exc:
                raise StorageUnavailable() from exc
        raise AssertionError("unreachable")

    async def fetch(
        self, tool: Tool, actor: Actor | str, arguments: ToolArguments
    ) -> Resource | None:
        """The tool's resource, loaded for ``actor`` with its tenant in the WHERE (read-only).
        Given only a tenant, the loader sees an actor without user or roles: loaders that
        decide ownership then answer `not_found` (fail closed); pass the actor."""
        load = tool.load
        if load is None:
            return None
        who = actor if isinstance(actor, Actor) else Actor(sub="-", tenant=actor)
        return await self._with_connection(lambda conn: load(conn, who, arguments, False))

    async def fetch_many(
        self, asks: Sequence[tuple[Tool, Actor, ToolArguments]]
    ) -> list[Resource | None]:
        """The resources of many calls, in order, on one connection (`load_resources`)."""
        if not any(tool.load is not None for tool, _, _ in asks):
            return [None] * len(asks)
        return await self._with_connection(lambda conn: load_resources(conn, asks))

    async def budget_windows(
        self, windows: Sequence[WindowAsk]
    ) -> dict[WindowAsk, tuple[int, int]]:
        """(used, reserved) of each budget window asked that has usage, in one query with the
        tenants in its WHERE (streams/budget_view.py)."""

        async def read(conn: AsyncConnection[Any]) -> dict[WindowAsk, tuple[int, int]]:
            async with conn.cursor() as cur:
                await cur.execute(
                    named_query(_PKG, "budget_view"),
                    {
                        "tenants": [w.tenant for w in windows],
                        "budgets": [w.budget for w in windows],
                        "scope_keys": [w.scope_key for w in windows],
                        "window_keys": [w.window_key for w in windows],
                        "since": [w.since for w in windows],
                    },
                )
                rows = await cur.fetchall()
            by_key = {(w.tenant, w.budget, w.scope_key, w.window_key): w for w in windows}
            return {
                by_key[(r["tenant"], r["budget"], r["scope_key"], r["window_key"])]: (
                    int(r["used"]),
                    int(r["reserved"]),
                )
                for r in rows
            }

        return await self._with_connection(read)

    async def operations_seen(self, calls: Sequence[AuthorizedCall]) -> list[OperationSeen]:
        """Register each call as its operation's approval request unless a call already is
        (insert-if-absent), then read the operation's request and ledger entry, tenant in
        every WHERE (streams/repeats.py). Each statement commits on its own (autocommit):
        the read after the insert sees a concurrent call's committed row."""

        async def seen(conn: AsyncConnection[Any]) -> list[OperationSeen]:
            found: list[OperationSeen] = []
            async with conn.cursor() as cur:
                for call in calls:
                    key = {"tenant": call.tenant, "idempotency_key": call.idempotency_key}
                    await cur.execute(
                        named_query(_PKG, "register_approval_request"),
                        {**key, "call_id": call.call_id, "fingerprint": call.fingerprint},
                    )
                    await cur.execute(named_query(_PKG, "operation_seen"), key)
                    row = await cur.fetchone()
                    found.append(OperationSeen(**row) if row is not None else OperationSeen())
            return found

        return await self._with_connection(seen)

    async def audit(self, audits: Sequence[Audit]) -> None:
        """Append audit rows, once per event key (a redelivered batch adds nothing)."""
        if not audits:
            return

        async def append(conn: AsyncConnection[Any]) -> None:
            async with conn.cursor() as cur:
                await cur.execute(named_query(_PKG, "insert_audit_rows"), audit_rows(audits))

        await self._with_connection(append)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
