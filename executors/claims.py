"""Redis fast path of dedup: an atomic claim on (tenant, idempotency key) with fingerprint,
owner, lease expiry and a fencing number, and the finished outcome once there is one.

Redis is the fast path only: the PostgreSQL ledger is the authority, so an empty, flushed or
failed-over Redis can slow things down but never cause a second effect.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from schemas.envelopes import Outcome
from schemas.names import REDIS_CLAIM_PREFIX, REDIS_OWNER_PREFIX
from telemetry.metrics import count_dedup

# KEYS[1] claim hash, KEYS[2] fencing counter. ARGV: fingerprint, owner, now_ms, lease_ms, ttl_ms
_CLAIM = """
local fp = redis.call('HGET', KEYS[1], 'fp')
if not fp then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'owner', ARGV[2],
             'lease', tonumber(ARGV[3]) + tonumber(ARGV[4]), 'fence', fence, 'state', 'running')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'claimed', fence, ''}
end
if fp ~= ARGV[1] then
  return {'conflict', 0, ''}
end
if redis.call('HGET', KEYS[1], 'state') == 'done' then
  return {'done', tonumber(redis.call('HGET', KEYS[1], 'fence')),
          redis.call('HGET', KEYS[1], 'outcome')}
end
local owner = redis.call('HGET', KEYS[1], 'owner')
-- ARGV[6]: an owner the caller found dead (its liveness mark expired): its lease counts as run out.
if tonumber(redis.call('HGET', KEYS[1], 'lease')) > tonumber(ARGV[3]) and owner ~= ARGV[2]
   and owner ~= ARGV[6] then
  return {'busy', tonumber(redis.call('HGET', KEYS[1], 'fence')), owner}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'lease', tonumber(ARGV[3]) + tonumber(ARGV[4]),
           'fence', fence)
return {'expired', fence, owner}
"""

# KEYS[1] claim hash. ARGV: fence, outcome json, ttl_ms. Only the fence holder may finish.
_FINISH = """
if tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1') ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'outcome', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] claim hash. ARGV: fence. Give a claim up (nothing happened) so others need not wait.
_RELEASE = """
if tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1') == tonumber(ARGV[1])
   and redis.call('HGET', KEYS[1], 'state') ~= 'done' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class ClaimKind(StrEnum):
    CLAIMED = "claimed"  # ours now, first claim
    DONE = "done"  # finished before: the stored outcome
    CONFLICT = "conflict"  # same key, other fingerprint
    BUSY = "busy"  # a live owner holds it: leave it to them
    EXPIRED = "expired"  # the previous owner's lease ran out: it may have acted
    UNAVAILABLE = "unavailable"  # Redis did not answer: the ledger decides alone


@dataclass(frozen=True, kw_only=True)
class ClaimRequest:
    """One operation to claim: (tenant, idempotency key) with the command's fingerprint."""

    tenant: str
    idempotency_key: str
    fingerprint: str


@dataclass(frozen=True, kw_only=True)
class ClaimFinish:
    """A finished operation's outcome, to store under its claim if ``fence`` still holds it."""

    tenant: str
    idempotency_key: str
    fence: int
    outcome: Outcome


@dataclass(frozen=True, kw_only=True)
class Claim:
    kind: ClaimKind
    fence: int = 0
    outcome: Outcome | None = None
    previous_owner: str | None = None


class ClaimStore:
    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        owner: str,
        lease_ms: int = 30_000,
        ttl_ms: int = 24 * 3600 * 1000,
        liveness_ms: int = 5_000,
    ) -> None:
        self._redis = redis
        self._prefix = f"{prefix}{REDIS_CLAIM_PREFIX}"
        self._fence_key = f"{self._prefix}fence"
        self.owner = owner
        self.lease_ms = lease_ms
        self._ttl_ms = ttl_ms
        self._owners = f"{prefix}{REDIS_OWNER_PREFIX}"
        self.liveness_ms = liveness_ms
        self._claim = redis.register_script(_CLAIM)
        self._finish = redis.register_script(_FINISH)
        self._release = redis.register_script(_RELEASE)

    def _key(self, tenant: str, idempotency_key: str) -> str:
        return f"{self._prefix}{tenant}:{idempotency_key}"

    async def heartbeat(self) -> None:
        """Mark this owner alive for ``liveness_ms`` (call it well within that period)."""
        try:
            await self._redis.set(f"{self._owners}{self.owner}", b"1", px=self.liveness_ms)
        except RedisError:
            return  # others then wait for our leases, as without the mark

    async def owner_alive(self, owner: str) -> bool:
        """Whether ``owner`` marked itself alive lately. Unknown (Redis error) counts as
        alive: waiting out the lease is the safe side."""
        try:
            return bool(await self._redis.exists(f"{self._owners}{owner}"))
        except RedisError:
            return True

    async def claim(
        self,
        tenant: str,
        idempotency_key: str,
        fingerprint: str,
        now_ms: int,
        *,
        dead_owner: str | None = None,
    ) -> Claim:
        """Claim the operation. ``dead_owner``: a holder found dead by :meth:`owner_alive`,
        whose claim is taken over like an expired one (the ledger and the new fencing number
        keep a holder that was only slow from doing harm)."""
        request = ClaimRequest(
            tenant=tenant, idempotency_key=idempotency_key, fingerprint=fingerprint
        )
        try:
            raw = await self._claim(
                keys=self._claim_keys(request),
                args=self._claim_args(request, now_ms, dead_owner),
            )
        except RedisError:
            count_dedup("redis", ClaimKind.UNAVAILABLE.value)
            return Claim(kind=ClaimKind.UNAVAILABLE)
        return self._parsed(raw)

    async def claim_many(self, requests: Sequence[ClaimRequest], now_ms: int) -> list[Claim]:
        """Claim several operations in one round trip (a pipeline of the same script, not a
        transaction: each claim is atomic on its own, exactly as :meth:`claim`). Redis away:
        every claim is ``UNAVAILABLE`` and the ledger decides alone."""
        if not requests:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for request in requests:
            await self._claim(
                keys=self._claim_keys(request),
                args=self._claim_args(request, now_ms, None),
                client=pipe,
            )
        try:
            raws = await pipe.execute(raise_on_error=False)
        except RedisError:
            raws = [RedisError()] * len(requests)
        claims = []
        for raw in raws:
            if isinstance(raw, Exception):
                count_dedup("redis", ClaimKind.UNAVAILABLE.value)
                claims.append(Claim(kind=ClaimKind.UNAVAILABLE))
            else:
                claims.append(self._parsed(raw))
        return claims

    def _claim_keys(self, request: ClaimRequest) -> list[str]:
        return [self._key(request.tenant, request.idempotency_key), self._fence_key]

    def _claim_args(
        self, request: ClaimRequest, now_ms: int, dead_owner: str | None
    ) -> list[str | int]:
        return [request.fingerprint, self.owner, now_ms, self.lease_ms, self._ttl_ms,
                dead_owner or ""]  # fmt: skip

    @staticmethod
    def _parsed(raw: Any) -> Claim:
        kind_raw, fence, extra = raw
        kind = ClaimKind(kind_raw.decode() if isinstance(kind_raw, bytes) else kind_raw)
        count_dedup("redis", kind.value)
        text = extra.decode() if isinstance(extra, bytes) else str(extra or "")
        if kind is ClaimKind.DONE:
            try:
                return Claim(
                    kind=kind, fence=int(fence), outcome=Outcome.model_validate(json.loads(text))
                )
            except ValueError:
                return Claim(kind=ClaimKind.UNAVAILABLE)  # unreadable: ask the ledger
        return Claim(kind=kind, fence=int(fence), previous_owner=text or None)

    async def finish(self, tenant: str, idempotency_key: str, fence: int, outcome: Outcome) -> bool:
        finish = ClaimFinish(
            tenant=tenant, idempotency_key=idempotency_key, fence=fence, outcome=outcome
        )
        try:
            done = await self._finish(keys=[self._key(tenant, idempotency_key)],
                                      args=self._finish_args(finish))  # fmt: skip
        except RedisError:
            return False
        return bool(done)

    async def finish_many(self, finishes: Sequence[ClaimFinish]) -> list[bool]:
        """Finish several claims in one round trip; each only if its fence still holds it
        (as :meth:`finish`). A Redis error finishes none: their claims stay `running` until
        their lease ends, and the ledger answers in the meantime."""
        if not finishes:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for finish in finishes:
            await self._finish(
                keys=[self._key(finish.tenant, finish.idempotency_key)],
                args=self._finish_args(finish),
                client=pipe,
            )
        try:
            done = await pipe.execute(raise_on_error=False)
        except RedisError:
            return [False] * len(finishes)
        return [not isinstance(d, Exception) and bool(d) for d in done]

    def _finish_args(self, finish: ClaimFinish) -> list[str | int]:
        return [finish.fence, finish.outcome.model_dump_json(), self._ttl_ms]

    async def release(self, tenant: str, idempotency_key: str, fence: int) -> None:
        try:
            await self._release(keys=[self._key(tenant, idempotency_key)], args=[fence])
        except RedisError:
            return
