"""The fleet limiter on real Redis: three worker processes share one budget; a redelivered
call gets its first answer; concurrency slots are held and released;
Redis away fails open for reads and closed for writes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from redis.asyncio import Redis

from commands.limits import Bucket, CallScope
from config.settings import Admission, Settings
from schemas.envelopes import Effect
from schemas.names import REDIS_SLOTS_PREFIX
from streams.limiter import Ask, FleetLimiter

pytestmark = pytest.mark.integration

# The issue asks for 60 s; `make test-admission-fleet` runs that, the suite a shorter run.
FLEET_SECONDS = float(os.environ.get("RATIFIER_TEST_ADMISSION_SECONDS", "8"))


def _ask(tenant: str, *buckets: Bucket, effect: Effect = Effect.READ) -> Ask:
    call = CallScope(
        call_id=uuid.uuid4().hex, tenant=tenant, agent="agent-1", tool="get_payment", effect=effect
    )
    return Ask(call=call, buckets=buckets)


def _prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}."


def _admitted_marks(redis_url: str, prefix: str) -> int:
    """Calls admitted under ``prefix``, counted in Redis (each call's decision mark), so a
    worker killed mid-batch is counted exactly."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{REDIS_SLOTS_PREFIX}{prefix}*", count=5000))
        admitted = 0
        for i in range(0, len(keys), 5000):
            values: list[bytes | str | None] = client.mget(keys[i : i + 5000])
            admitted += sum(1 for v in values if isinstance(v, bytes) and v.startswith(b"0"))
        return admitted
    finally:
        client.close()


@pytest.mark.timeout(FLEET_SECONDS + 60)
def test_three_worker_processes_share_one_rate_and_one_killed_keeps_it(
    settings: Settings,
) -> None:
    """Three OS processes, each the real limiter on the real Redis offering twice the limit,
    share one 300/s budget; one is SIGKILLed half-way; the fleet's admitted count stays
    within ±10 % of burst + rate * the run."""
    prefix = _prefix()
    rate, burst = 300.0, 30.0
    start = time.time() + 3.0  # after the three processes started and connected
    end = start + FLEET_SECONDS
    env = {**os.environ, "RATIFIER_STORAGE__REDIS_URL": settings.storage.redis_url}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testsupport.admission_worker",
                prefix,
                str(rate),
                str(burst),
                str(start),
                str(end),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    lines: list[list[str]] = [[] for _ in workers]
    readers = [
        threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout), daemon=True)
        for p, out in zip(workers, lines, strict=True)
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.time() + 30
        while not all("ready\n" in out for out in lines) and time.time() < deadline:
            time.sleep(0.05)
        assert all("ready\n" in out for out in lines), "a worker did not start"
        # Worker 2 dies half-way, without a chance to tidy anything up.
        time.sleep(max(0.0, start + FLEET_SECONDS / 2 - time.time()))
        workers[2].send_signal(signal.SIGKILL)
        for worker in workers:
            worker.wait(timeout=FLEET_SECONDS + 30)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for reader, worker in zip(readers, workers, strict=True):
        reader.join(timeout=5)
        if worker.stdout is not None:
            worker.stdout.close()
    marks = [_marks(out) for out in lines]
    by_worker = [m[-1][1] if m else 0 for m in marks]
    assert workers[2].returncode == -signal.SIGKILL
    assert workers[0].returncode == 0 and workers[1].returncode == 0
    total = _admitted_marks(settings.storage.redis_url, prefix)
    expected = burst + rate * (end - start)
    # Each worker's share while all three ran (after the first second's burst), and the two
    # survivors' after the kill (from a second after it): within ±25 % of each other.
    killed = max(t for t, _ in marks[2])
    together = [_between(m, start + 1.0, killed) for m in marks]
    after = [_between(m, killed + 1.0, end) for m in marks[:2]]
    print(
        f"fleet of 3 processes: {total} admitted in {end - start:.1f} s, expected"
        f" {expected:.0f} ({(total - expected) / expected:+.1%}), by worker {by_worker}"
        f" (worker 2 killed half-way); while all three ran {together}, after {after}"
    )
    assert abs(total - expected) <= 0.10 * expected, (total, expected, by_worker)
    assert total >= sum(by_worker)  # the killed worker's last batch counted too
    # No worker starves while another takes the refill (issue 45).
    for shares in (together, after):
        mean = sum(shares) / len(shares)
        assert all(abs(n - mean) <= 0.25 * mean for n in shares), (together, after)


def _marks(out: list[str]) -> list[tuple[float, int]]:
    """A worker's ``admitted <n> <time>`` lines as (time, running total)."""
    found = []
    for line in out:
        if line.startswith("admitted"):
            _, n, at = line.split()
            found.append((float(at), int(n)))
    return found


def _between(marks: list[tuple[float, int]], since: float, until: float) -> int:
    """What a worker admitted between two times (its running totals at each)."""

    def at(moment: float) -> int:
        return max((n for t, n in marks if t <= moment), default=0)

    return at(until) - at(since)


async def _in_turn(redis: Redis, tenant: str, asks: tuple[int, int]) -> tuple[list[int], float]:
    """Two workers (limiters of one prefix) on one bucket of 200/s, burst 20, asking in turn
    every 50 ms, the first ``asks[0]`` calls, then the second ``asks[1]``, 40 rounds: what
    each got after the first 5 rounds, and what the bucket refilled meanwhile."""
    prefix = _prefix()
    workers = [FleetLimiter(redis, Admission(), prefix=prefix) for _ in asks]
    bucket = Bucket(key=f"tenant:{tenant}", rate=200.0, capacity=20.0, concurrency=None)
    got = [0, 0]
    counted_from = time.monotonic()
    for round_ in range(40):
        for n, (limiter, asked) in enumerate(zip(workers, asks, strict=True)):
            verdicts = await limiter.admit([_ask(tenant, bucket) for _ in range(asked)])
            got[n] += sum(v.admitted for v in verdicts) if round_ >= 5 else 0
        if round_ == 4:
            counted_from = time.monotonic()
        await asyncio.sleep(0.05)  # the offered load's pace, not a wait for a condition
    return got, 200.0 * (time.monotonic() - counted_from)


async def test_two_workers_asking_in_lockstep_share_the_refill(redis: Redis) -> None:
    """The first worker always asks right after the refill and the second right after it:
    without fair shares the first takes every refill and the second starves (5 of 365 in one
    run); with them each takes about half."""
    got, offered = await _in_turn(redis, "lockstep", (30, 30))
    print(f"lockstep: {got} of {offered:.0f} refilled")
    assert abs(got[0] - got[1]) <= 0.25 * sum(got) / 2, got
    assert sum(got) >= 0.85 * offered, (got, offered)  # shares, but nothing left unused


async def test_a_busy_worker_takes_what_a_quiet_one_leaves(redis: Redis) -> None:
    """Fair shares do not cap a worker whose peer asks little: what the quiet one leaves in
    the bucket goes to the busy one (it draws what the other credits do not claim; drawing on
    its own credit only, it got 182 of 375 in one run)."""
    got, offered = await _in_turn(redis, "quiet", (30, 1))
    print(f"busy and quiet: {got} of {offered:.0f} refilled")
    assert got[1] >= 30  # the quiet one's few calls get through
    assert sum(got) >= 0.85 * offered, (got, offered)


async def test_refusals_advise_spread_waits_and_a_redelivered_call_gets_its_answer(
    redis: Redis,
) -> None:
    limiter = FleetLimiter(redis, Admission(), prefix=_prefix())
    bucket = Bucket(key="tenant:b", rate=10.0, capacity=2.0, concurrency=None)
    asks = [_ask("b", bucket) for _ in range(5)]
    verdicts = await limiter.admit(asks)
    assert [v.admitted for v in verdicts] == [True, True, False, False, False]
    waits = [v.retry_after or 0 for v in verdicts[2:]]
    assert waits == sorted(waits) and 0 < waits[0] <= 0.11 and waits[-1] <= 0.31
    again = await limiter.admit(asks)  # the batch redelivered after a worker's crash
    assert [v.admitted for v in again] == [True, True, False, False, False]
    fresh = await limiter.admit([_ask("b", bucket)])
    assert not fresh[0].admitted  # the redelivery drew nothing, but the bucket is still empty


async def test_concurrency_slots_are_held_until_released(redis: Redis) -> None:
    limiter = FleetLimiter(redis, Admission(), prefix=_prefix())
    bucket = Bucket(key="tenant_tool:c:refund", rate=None, capacity=2, concurrency=2)
    first = [_ask("c", bucket, effect=Effect.EXTERNAL_WRITE) for _ in range(3)]
    verdicts = await limiter.admit(first)
    assert [v.admitted for v in verdicts] == [True, True, False]
    assert (await limiter.admit([_ask("c", bucket)]))[0].admitted is False
    assert await limiter.release([first[0].call.call_id]) == 1
    assert await limiter.release([first[0].call.call_id]) == 0  # releasing twice is harmless
    assert (await limiter.admit([_ask("c", bucket)]))[0].admitted is True


async def test_redis_away_admits_reads_and_refuses_writes(settings: Settings) -> None:
    away = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    limiter = FleetLimiter(away, Admission(), prefix=_prefix())
    bucket = Bucket(key="tenant:d", rate=5.0, capacity=5.0, concurrency=None)
    read, write = _ask("d", bucket), _ask("d", bucket, effect=Effect.EXTERNAL_WRITE)
    verdicts = await limiter.admit([read, write])
    assert verdicts[0].admitted
    assert not verdicts[1].admitted and verdicts[1].reason == "unavailable"
    assert verdicts[1].retry_after == Admission().shed_retry_after_seconds
    assert limiter.unavailable == 1
    await away.aclose()
