"""Fair shares' Lua on real Redis (streams/lua/usage.lua, runtime/lua/report_load.lua): the
fleet's usage adds every worker's counts and decays by Redis' clock, the largest fresh delay
is the one read, a report gone stale is not counted, and quiet tenants are pruned; the
validator's tick gives its shedder a heavy tenant only while a stage queues."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from redis.asyncio import Redis

from config.settings import Admission, Settings
from runtime.load import REPORT_SCRIPT, load_key, report_waiting
from schemas.names import REDIS_USAGE_PREFIX
from streams.fair_share import USAGE_SCRIPT, FairShedder, parse_view, watch_fair_share

pytestmark = pytest.mark.integration

TAU_MS = 1000.0


async def _view(
    redis: Redis, prefix: str, *counts: tuple[str, int, int], fresh_ms: float = 500
) -> tuple[float, dict[str, tuple[float, float]]]:
    script = redis.register_script(USAGE_SCRIPT)
    args: list[str | float | int] = [TAU_MS, fresh_ms, 1.0]
    for tenant, judged, admitted in counts:
        args += [tenant, judged, admitted]
    answer = await script(keys=[f"{REDIS_USAGE_PREFIX}{prefix}", load_key(prefix)], args=args)
    delay, usage = parse_view(answer)
    return delay, {t: (u.judged, u.admitted) for t, u in usage.items()}


async def test_usage_adds_every_worker_and_decays(settings: Settings) -> None:
    prefix = f"fair-{uuid.uuid4().hex[:8]}."
    redis = Redis.from_url(settings.storage.redis_url)
    try:
        # Two workers' ticks: 100 + 50 judged calls of tenant-a over tau (1 s) is 150/s.
        await _view(redis, prefix, ("tenant-a", 100, 40), ("tenant-b", 3, 3))
        delay, usage = await _view(redis, prefix, ("tenant-a", 50, 10))
        assert delay == 0.0
        judged, admitted = usage["tenant-a"]
        assert 140 <= judged <= 150 and 45 <= admitted <= 50
        assert 2.5 <= usage["tenant-b"][0] <= 3
        # A second and a half later: decayed by Redis' clock (e^-1.5 = 0.22).
        await asyncio.sleep(1.5)
        _, usage = await _view(redis, prefix)
        assert 25 <= usage["tenant-a"][0] <= 40
        assert "tenant-b" not in usage  # below 1 call/s: not active
        # Far below: pruned from the hash.
        await redis.hset(f"{REDIS_USAGE_PREFIX}{prefix}", "tenant-c", "0.001 0 1")
        await _view(redis, prefix)
        assert not await redis.hexists(f"{REDIS_USAGE_PREFIX}{prefix}", "tenant-c")
    finally:
        await redis.delete(f"{REDIS_USAGE_PREFIX}{prefix}", load_key(prefix))
        await redis.aclose()


async def test_the_largest_fresh_delay_is_read_and_a_stale_one_is_not(settings: Settings) -> None:
    prefix = f"fair-{uuid.uuid4().hex[:8]}."
    redis = Redis.from_url(settings.storage.redis_url)
    report = redis.register_script(REPORT_SCRIPT)
    try:
        await report(keys=[load_key(prefix)], args=["execute/1", "80.0"])
        await report(keys=[load_key(prefix)], args=["stages/2", "12.5"])
        delay, _ = await _view(redis, prefix)
        assert delay == pytest.approx(0.080)
        # The executor stops reporting: once its report is older than the freshness, the
        # stages' is the one counted.
        await asyncio.sleep(0.3)
        await report(keys=[load_key(prefix)], args=["stages/2", "12.5"])
        delay, _ = await _view(redis, prefix, fresh_ms=200)
        assert delay == pytest.approx(0.0125)
    finally:
        await redis.delete(f"{REDIS_USAGE_PREFIX}{prefix}", load_key(prefix))
        await redis.aclose()


async def test_the_tick_makes_the_flooding_tenant_heavy_only_while_a_stage_queues(
    settings: Settings,
) -> None:
    prefix = f"fair-{uuid.uuid4().hex[:8]}."
    redis = Redis.from_url(settings.storage.redis_url)
    admission = Admission(fair_target_seconds=0.025, fair_tick_seconds=0.025)
    shedder = FairShedder(admission)
    waiting = [0.0]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(watch_fair_share(redis, shedder, topic_prefix=prefix, stop=stop)),
        asyncio.create_task(
            report_waiting(
                redis,
                topic_prefix=prefix,
                stage="execute",
                waiting=[lambda: waiting[0]],
                period=0.025,
                stop=stop,
            )
        ),
    ]

    async def flood_until(done: bool, within: float = 5.0) -> None:
        """tenant-a judged 200 calls and tenant-b 1 per 25 ms until ``shedding`` is ``done``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while shedder.share.shedding is not done:
            assert loop.time() < deadline, shedder.share
            for _ in range(200):
                shedder.admits("tenant-a")
            shedder.admits("tenant-b")
            await asyncio.sleep(0.025)

    try:
        # No queue: nothing is shed, however heavy tenant-a is (0.5 s of its flood).
        for _ in range(20):
            for _ in range(200):
                assert shedder.admits("tenant-a")
            shedder.admits("tenant-b")
            await asyncio.sleep(0.025)
        assert not shedder.share.shedding and shedder.refusals == 0
        waiting[0] = 0.2  # the executor queues
        await flood_until(True)
        assert shedder.share.heavy == {"tenant-a"}
        refused_before = shedder.refusals
        assert all(shedder.admits("tenant-b") for _ in range(20))
        assert not any(shedder.admits("tenant-a") for _ in range(20))  # 8x the target: none
        assert shedder.refusals == refused_before + 20
        waiting[0] = 0.0  # drained: the fraction grows back to all
        await flood_until(False)
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await redis.delete(f"{REDIS_USAGE_PREFIX}{prefix}", load_key(prefix))
        await redis.aclose()
