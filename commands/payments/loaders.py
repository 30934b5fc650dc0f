"""Loaders: the resource each tool acts on, read in the caller's tenant (its SQL in
``sql/``); a foreign resource looks exactly like a missing one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from commands.catalog import Connection, Resource
from commands.sql import named_query
from schemas.envelopes import Actor

_PKG = __name__.rpartition(".")[0]


async def fetch_one(conn: Connection, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    async with conn.cursor() as cur:
        await cur.execute(named_query(_PKG, name), params)
        row = await cur.fetchone()
    return dict(row) if row is not None else None


async def fetch_all(conn: Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor() as cur:
        await cur.execute(named_query(_PKG, name), params)
        return [dict(row) for row in await cur.fetchall()]


def _payment(row: dict[str, Any]) -> Resource:
    return Resource(
        kind="payment", id=row.pop("payment_id"), tenant=row.pop("tenant"), attributes=row
    )


async def load_payment(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    query = "payment_by_id_for_update" if for_update else "payment_by_id"
    row = await fetch_one(conn, query, {"tenant": tenant, "payment_id": args.payment_id})
    return _payment(row) if row is not None else None


async def load_payments(
    conn: Connection, tenant: str, reads: Sequence[tuple[Actor, Any]]
) -> list[Resource | None]:
    """`load_payment` for many reads of ``tenant``: one query."""
    ids = sorted({args.payment_id for _, args in reads})
    rows = await fetch_all(conn, "payments_by_ids", {"tenant": tenant, "payment_ids": ids})
    found = {row["payment_id"]: _payment(row) for row in rows}
    return [found.get(args.payment_id) for _, args in reads]


async def load_refund_policy(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await fetch_one(conn, "refund_policy_by_tenant", {"tenant": tenant})
    if row is None:
        return None
    return Resource(kind="refund_policy", id=tenant, tenant=row.pop("tenant"), attributes=row)


async def load_refund_policies(
    conn: Connection, tenant: str, reads: Sequence[tuple[Actor, Any]]
) -> list[Resource | None]:
    """`load_refund_policy` for many reads of ``tenant``: the tenant's one policy, once."""
    row = await fetch_one(conn, "refund_policy_by_tenant", {"tenant": tenant})
    if row is None:
        return [None] * len(reads)
    policy = Resource(kind="refund_policy", id=tenant, tenant=row.pop("tenant"), attributes=row)
    return [policy] * len(reads)


def _refund(row: dict[str, Any]) -> Resource:
    return Resource(
        kind="refund", id=row.pop("refund_id"), tenant=row.pop("tenant"), attributes=row
    )


async def load_refund(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await fetch_one(conn, "refund_by_id", {"tenant": tenant, "refund_id": args.refund_id})
    return _refund(row) if row is not None else None


async def load_refunds(
    conn: Connection, tenant: str, reads: Sequence[tuple[Actor, Any]]
) -> list[Resource | None]:
    """`load_refund` for many reads of ``tenant``: one query."""
    ids = sorted({args.refund_id for _, args in reads})
    rows = await fetch_all(conn, "refunds_by_ids", {"tenant": tenant, "refund_ids": ids})
    found = {row["refund_id"]: _refund(row) for row in rows}
    return [found.get(args.refund_id) for _, args in reads]


async def load_payment_method(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    query = "payment_method_by_id_for_update" if for_update else "payment_method_by_id"
    row = await fetch_one(
        conn, query, {"tenant": tenant, "payment_method_id": args.payment_method_id}
    )
    if row is None:
        return None
    return Resource(
        kind="payment_method",
        id=row.pop("payment_method_id"),
        tenant=row.pop("tenant"),
        attributes=row,
    )
