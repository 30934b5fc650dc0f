"""A claim held by a dead executor is taken over as soon as its liveness mark lapses, not
after its lease; a live holder keeps it; the dead holder's late finish is refused."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import Redis

from config.settings import Settings
from executors.claims import ClaimKind, ClaimStore
from tests.integration.test_pipelined_claims import claim_outcome

pytestmark = pytest.mark.integration


async def test_dead_owners_claim_is_taken_over_before_its_lease_ends(
    redis: Redis, settings: Settings
) -> None:
    prefix = f"owners-{uuid.uuid4().hex[:8]}."
    holder = ClaimStore(redis, prefix=prefix, owner="exec-a", lease_ms=60_000, liveness_ms=400)
    other = ClaimStore(redis, prefix=prefix, owner="exec-b", lease_ms=60_000, liveness_ms=400)
    key, fp = f"op-{uuid.uuid4().hex[:8]}", "f" * 64

    await holder.heartbeat()
    first = await holder.claim("tenant-a", key, fp, int(time.time() * 1000))
    assert first.kind is ClaimKind.CLAIMED

    # Alive: the other executor must wait, and naming someone else as dead changes nothing.
    busy = await other.claim("tenant-a", key, fp, int(time.time() * 1000), dead_owner="exec-z")
    assert (busy.kind, busy.previous_owner) == (ClaimKind.BUSY, "exec-a")
    assert await other.owner_alive("exec-a")

    # The holder stops refreshing its mark (it was killed): the mark lapses in liveness_ms.
    deadline = time.monotonic() + 5
    while await other.owner_alive("exec-a"):
        assert time.monotonic() < deadline, "liveness mark did not lapse"
        await asyncio.sleep(0.05)

    taken = await other.claim("tenant-a", key, fp, int(time.time() * 1000), dead_owner="exec-a")
    assert taken.kind is ClaimKind.EXPIRED
    assert taken.previous_owner == "exec-a"
    assert taken.fence > first.fence
    # A holder that was only slow cannot finish with its old fencing number.
    late = claim_outcome(key, tool="get_payment")
    assert not await holder.finish("tenant-a", key, first.fence, late)
    assert await other.finish("tenant-a", key, taken.fence, late)
