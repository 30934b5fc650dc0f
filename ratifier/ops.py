"""`ratifier ops`: what humans do about operations whose outcome is unknown.

`ops unknown` reads PostgreSQL only; `ops resolve` verifies the operator's token, checks their
right to the operation's tenant by Cedar policy (approvals/operator_policies), settles the
operation with their identity in the audit, and publishes the owed outcomes. The catalog and
the reconciler load only for a resolution (an operator's command starts fast)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from commands.sql import named_query
from config.settings import Settings
from runtime.clients import database_conninfo, pg_pool
from schemas.envelopes import Actor, Outcome

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("ratifier.ops")


def _pool(settings: Settings) -> AsyncConnectionPool[Any]:
    return pg_pool(database_conninfo(settings), max_size=2, dict_rows=True)


async def list_unknown(settings: Settings, *, tenant: str | None) -> list[dict[str, Any]]:
    async with _pool(settings) as pool, pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(named_query("executors", "list_unknown"), {"tenant": tenant})
        return [dict(r) for r in await cur.fetchall()]


async def unpublished_settlements(settings: Settings) -> dict[str, Any]:
    """Settled outcomes still owed to calls (published on the reconciler's next cycle)."""
    async with _pool(settings) as pool, pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(named_query("executors", "unpublished_settlements"))
        found = await cur.fetchone()
    return dict(found) if found else {"owed": 0, "oldest_age_seconds": 0.0}


def _when(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "-"
    seconds = (at - now).total_seconds()
    return f"in {seconds:.0f}s" if seconds >= 0 else f"{-seconds:.0f}s ago"


def describe_unknown(rows: list[dict[str, Any]], now: datetime) -> list[str]:
    """Each waiting operation and why: its state, checks so far, the last check's result,
    when it is checked next, and every call waiting for its outcome."""
    lines = [f"{len(rows)} operations with an unknown outcome"]
    for row in rows:
        escalated = row["escalated_at"] is not None
        recorded = row.get("waiting_calls") or ()
        calls = [row["call_id"], *(c for c in recorded if c != row["call_id"])]
        lines.append(
            f"{row['operation_id']:40}  {row['tool']:20}  "
            f"{'ESCALATED' if escalated else 'reconciling':11}  "
            f"checks {row['reconcile_attempts']:3}  call {row['call_id']}"
        )
        lines.append(
            f"    last check: {row.get('last_check') or 'not checked yet'}"
            f" ({_when(row.get('last_checked_at'), now)})"
        )
        lines.append(
            "    next check: "
            + (
                "none: waits for `ratifier ops resolve`"
                if escalated
                else _when(row["next_check_at"], now)
                if row["next_check_at"] is not None
                else "now"
            )
        )
        lines.append(f"    waiting calls ({len(calls)}): {', '.join(calls)}")
    return lines


def resolver_from(settings: Settings, token: str | None, operation_id: str) -> Actor:
    """The operator named by ``token`` (verified), if they may resolve ``operation_id``'s
    tenant's operations; `Unauthenticated` / `PolicyDenied` otherwise (nothing changed)."""
    from approvals.operators import OperatorRights, check_resolver, operator_from
    from runtime.identity import context_keys

    operator = operator_from(token, context_keys(settings))
    check_resolver(OperatorRights.from_directory(), operator, operation_id.partition(":")[0])
    return operator


async def resolve_operation(
    settings: Settings,
    operation_id: str,
    *,
    applied: bool,
    reference: str | None,
    by: Actor,
) -> Outcome | None:
    """Settle ``operation_id`` as ``by`` (checked by :func:`resolver_from`) decided."""
    from aiokafka.errors import KafkaError

    from commands.catalog import load_catalog
    from executors.reconciler_store import Reconciler
    from runtime.clients import kafka_producer

    tenant = operation_id.partition(":")[0]
    catalog = load_catalog(settings.catalog)
    async with _pool(settings) as pool:
        reconciler = Reconciler(pool=pool, catalog=catalog, attempts=1, backoff_base=1.0)
        outcome = await reconciler.resolve(
            tenant, operation_id, applied=applied, reference=reference, by=by
        )
        if outcome is not None:
            # Owed to every call waiting on the operation, recorded with the resolution;
            # should publishing fail here, the reconciler publishes them from the outbox.
            producer = kafka_producer(settings)
            try:
                await producer.start()
                await reconciler.publish_owed(producer, settings, operation_id=operation_id)
            except (KafkaError, TimeoutError, OSError) as exc:
                log.warning("resolved; the reconciler will publish the outcomes (%s)", exc)
            finally:
                await producer.stop()
    return outcome
