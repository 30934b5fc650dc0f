"""Loaders: the resource each tool acts on, read in the caller's tenant (its SQL in
``sql/``); a foreign resource looks exactly like a missing one."""

from __future__ import annotations

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


async def load_payment(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    query = "payment_by_id_for_update" if for_update else "payment_by_id"
    row = await fetch_one(conn, query, {"tenant": tenant, "payment_id": args.payment_id})
    if row is None:
        return None
    return Resource(
        kind="payment",
        id=row.pop("payment_id"),
        tenant=row.pop("tenant"),
        attributes=row,
    )


async def load_refund_policy(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await fetch_one(conn, "refund_policy_by_tenant", {"tenant": tenant})
    if row is None:
        return None
    return Resource(kind="refund_policy", id=tenant, tenant=row.pop("tenant"), attributes=row)


async def load_refund(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await fetch_one(conn, "refund_by_id", {"tenant": tenant, "refund_id": args.refund_id})
    if row is None:
        return None
    return Resource(
        kind="refund", id=row.pop("refund_id"), tenant=row.pop("tenant"), attributes=row
    )


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
