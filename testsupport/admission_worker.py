"""One admission worker as an OS process of its own (`make test-admission-fleet`): the real
fleet limiter (streams/limiter.py) against the real Redis, offering calls of one tenant in
batches as a validator worker would, from a wall-clock start until an end:

    python -m testsupport.admission_worker PREFIX RATE BURST START END [OFFER_PER_SECOND]

It prints ``ready`` once connected, then after every batch ``admitted <n> <unix time>`` (its
running total), flushed, so a test that SIGKILLs it still knows what it admitted until then,
and when."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from commands.limits import Bucket, CallScope
from config.settings import Settings
from runtime.clients import redis_client
from schemas.envelopes import Effect
from streams.limiter import Ask, FleetLimiter

BATCH = 30


async def offer(
    prefix: str, *, rate: float, burst: float, start: float, end: float, per_s: float
) -> int:
    settings = Settings()
    redis = redis_client(settings)
    limiter = FleetLimiter(redis, settings.admission, prefix=prefix)
    bucket = Bucket(key="tenant:fleet", rate=rate, capacity=burst, concurrency=None)
    await redis.ping()
    print("ready", flush=True)
    admitted = 0
    await asyncio.sleep(max(0.0, start - time.time()))
    every = BATCH / per_s
    due = time.monotonic()
    try:
        while time.time() < end:
            calls = [
                Ask(
                    call=CallScope(
                        call_id=uuid.uuid4().hex,
                        tenant="fleet",
                        agent="agent-1",
                        tool="get_payment",
                        effect=Effect.READ,
                    ),
                    buckets=(bucket,),
                )
                for _ in range(BATCH)
            ]
            verdicts = await limiter.admit(calls)
            admitted += sum(v.admitted for v in verdicts)
            print(f"admitted {admitted} {time.time():.3f}", flush=True)
            due += every
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    finally:
        await redis.aclose()
    return admitted


def main(argv: list[str]) -> int:
    prefix, rate, burst, start, end = argv[:5]
    per_s = float(argv[5]) if len(argv) > 5 else 600.0
    asyncio.run(
        offer(
            prefix,
            rate=float(rate),
            burst=float(burst),
            start=float(start),
            end=float(end),
            per_s=per_s,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
