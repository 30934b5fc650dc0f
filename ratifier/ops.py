"""`ratifier ops`: what humans do about operations whose outcome is unknown."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from commands.catalog import load_catalog
from commands.sql import named_query
from executors.reconciler import Reconciler, publish_outcomes
from schemas.envelopes import Outcome
from schemas.settings import Settings


def _pool(settings: Settings) -> AsyncConnectionPool[Any]:
    return AsyncConnectionPool(
        settings.database_url, min_size=1, max_size=2, open=False, kwargs={"row_factory": dict_row}
    )


async def list_unknown(settings: Settings, *, tenant: str | None) -> list[dict[str, Any]]:
    async with _pool(settings) as pool, pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(named_query("executors", "list_unknown"), {"tenant": tenant})
        return [dict(r) for r in await cur.fetchall()]


async def resolve_operation(
    settings: Settings, operation_id: str, *, applied: bool, reference: str | None, by: str
) -> Outcome | None:
    tenant = operation_id.partition(":")[0]
    catalog = load_catalog(settings.catalog)
    async with _pool(settings) as pool:
        reconciler = Reconciler(pool=pool, catalog=catalog, attempts=1, backoff_base=1.0)
        outcome = await reconciler.resolve(
            tenant, operation_id, applied=applied, reference=reference, by=by
        )
    if outcome is not None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await publish_outcomes(producer, settings, [outcome])
        finally:
            await producer.stop()
    return outcome
