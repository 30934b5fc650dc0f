"""What the fleet's admission buckets hold right now (`ratifier limits`, the dashboard's
/api/limits): every live bucket of the deployment in Redis, read with SCAN (never KEYS)."""

from __future__ import annotations

from config.settings import Settings
from runtime.clients import redis_client
from schemas.names import REDIS_LIMIT_PREFIX


async def limit_usage(settings: Settings, *, tenant: str | None = None) -> list[tuple[str, str]]:
    """(bucket, what it holds) of every live bucket of this deployment (of ``tenant`` only,
    when given), sorted; a rate bucket holds tokens (as last written), a concurrency bucket
    calls in flight."""
    base = f"{REDIS_LIMIT_PREFIX}{settings.topic_prefix}"
    redis = redis_client(settings)
    found: list[tuple[str, str]] = []
    try:
        async for raw in redis.scan_iter(match=f"{base}*", count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            bucket, _, kind = key.removeprefix(base).rpartition(":")
            if tenant is not None and f":{tenant}:" not in f"{bucket}:":
                continue
            if kind == "r":
                tokens = await redis.hget(key, "t")
                held = f"{float(tokens):.1f} tokens left" if tokens is not None else "?"
            else:
                held = f"{await redis.zcard(key)} in flight"
            found.append((bucket, held))
    finally:
        await redis.aclose()
    return sorted(found)
