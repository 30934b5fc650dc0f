"""The executor's circuit breakers (docs/execution.md, "Circuit breakers"): one per
downstream and effect class, named by the catalog, kept in Redis (`runtime.breakers`), their
state changes published on `breakers` (audited like every record)."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from commands.catalog import Catalog, downstream_of
from config.settings import BreakerThresholds, Settings
from runtime.breakers import FleetBreakers, breaker_name
from schemas.envelopes import BreakerTransition, Effect
from schemas.names import Topic


def catalog_thresholds(catalog: Catalog) -> dict[str, BreakerThresholds]:
    """The thresholds a catalog's tools declare for their breakers (``Tool.breaker``)."""
    own: dict[str, BreakerThresholds] = {}
    for tool in catalog:
        downstream = downstream_of(catalog, tool)
        if downstream is not None and tool.breaker is not None:
            own[breaker_name(downstream, read=tool.effect is Effect.READ)] = tool.breaker
    return own


def fleet_breakers(
    settings: Settings,
    catalog: Catalog,
    redis: Redis,
    producer: AIOKafkaProducer,
    *,
    by: str,
) -> FleetBreakers | None:
    """This executor's view of the shared breakers (None: switched off in the settings)."""
    if not settings.breakers.enabled:
        return None
    topic = settings.topic(Topic.BREAKERS)

    async def publish(transition: BreakerTransition) -> None:
        await producer.send_and_wait(
            topic, key=transition.breaker.encode(), value=transition.to_bytes()
        )

    return FleetBreakers(
        redis,
        prefix=settings.topic_prefix,
        defaults=settings.breakers,
        own=catalog_thresholds(catalog),
        by=by,
        publish=publish,
    )
