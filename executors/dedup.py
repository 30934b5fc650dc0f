"""Redis fast path: finished outcomes by (tenant, idempotency key), so a duplicate command
is answered without touching PostgreSQL. Redis is a cache here; the ledger is the authority.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from schemas.envelopes import Outcome
from schemas.names import REDIS_OUTCOME_PREFIX


@dataclass(frozen=True, kw_only=True)
class CachedOutcome:
    fingerprint: str
    outcome: Outcome


class OutcomeCache:
    def __init__(self, redis: Redis, *, prefix: str, ttl_seconds: int) -> None:
        self._redis = redis
        self._prefix = f"{prefix}{REDIS_OUTCOME_PREFIX}"
        self._ttl = ttl_seconds

    def _key(self, tenant: str, idempotency_key: str) -> str:
        return f"{self._prefix}{tenant}:{idempotency_key}"

    async def get(self, tenant: str, idempotency_key: str) -> CachedOutcome | None:
        """The cached outcome, or None (also when Redis is unreachable: fall back to the
        ledger rather than stall)."""
        try:
            raw = await self._redis.get(self._key(tenant, idempotency_key))
        except RedisError:
            return None
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return CachedOutcome(
                fingerprint=data["fingerprint"], outcome=Outcome.model_validate(data["outcome"])
            )
        except (ValueError, KeyError, TypeError):
            return None

    async def put(self, tenant: str, idempotency_key: str, cached: CachedOutcome) -> None:
        body = json.dumps(
            {"fingerprint": cached.fingerprint, "outcome": cached.outcome.model_dump(mode="json")}
        )
        try:
            await self._redis.set(self._key(tenant, idempotency_key), body, ex=self._ttl)
        except RedisError:
            return
