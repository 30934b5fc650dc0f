"""The fake payment provider and its client over real loopback HTTP: idempotent replays,
concurrency, and how each switchable fault is classified (transient, permanent, unknown)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from commands.payments.provider_client import PaymentProvider
from schemas.errors import OutcomeUnknown, PermanentFailure, TransientFailure
from testsupport.provider import bound_port, serve

pytestmark = pytest.mark.integration

REFUND: dict[str, Any] = {
    "tenant": "tenant-a",
    "payment_id": "pay_A1001",
    "amount_minor": 1500,
    "currency": "EUR",
}


class Admin:
    """Test-only access to the provider's fault switches and counters."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url

    async def faults(self, **faults: Any) -> None:
        async with self.session.post(f"{self.base_url}/_faults", json=faults) as response:
            assert response.status == 200, await response.text()

    async def clear_faults(self) -> None:
        async with self.session.delete(f"{self.base_url}/_faults") as response:
            assert response.status == 200

    async def stats(self) -> dict[str, Any]:
        async with self.session.get(f"{self.base_url}/_stats") as response:
            assert response.status == 200
            stats: dict[str, Any] = await response.json()
        # When each refund was applied (the kill-switch tests' clock): one per applied key.
        applied_at = stats.pop("applied_at")
        assert set(applied_at) == set(stats["by_key"])
        return stats

    async def post_raw(self, body: Any, key: str | None) -> tuple[int, Any]:
        headers = {"Idempotency-Key": key} if key is not None else {}
        async with self.session.post(
            f"{self.base_url}/refunds", json=body, headers=headers
        ) as response:
            return response.status, await response.json()


@pytest.fixture
async def provider() -> AsyncIterator[web.AppRunner]:
    runner = await serve("127.0.0.1", 0)
    yield runner
    await runner.cleanup()


@pytest.fixture
def base_url(provider: web.AppRunner) -> str:
    return f"http://127.0.0.1:{bound_port(provider)}"


@pytest.fixture
async def admin(base_url: str) -> AsyncIterator[Admin]:
    async with aiohttp.ClientSession() as session:
        yield Admin(session, base_url)


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[PaymentProvider]:
    async with PaymentProvider(base_url, timeout_seconds=2.0) as client:
        yield client


def key() -> str:
    return f"tenant-a:k-{uuid.uuid4().hex[:12]}"


async def test_replay_returns_the_first_refund_and_applies_once(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    first = await client.create_refund(idempotency_key=k, **REFUND)
    again = await client.create_refund(idempotency_key=k, **REFUND)
    assert first == again
    assert first.id.startswith("prv_")
    assert (first.status, first.idempotency_key, first.amount_minor) == ("succeeded", k, 1500)
    assert await client.find_refund(k) == first
    assert await client.find_refund(key()) is None
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 2}


async def test_status_codes_of_first_application_and_replay(admin: Admin) -> None:
    k = key()
    status, first = await admin.post_raw(REFUND, k)
    assert status == 201
    status, again = await admin.post_raw(REFUND, k)
    assert (status, again) == (200, first)


async def test_same_key_other_body_is_refused_and_not_applied(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    first = await client.create_refund(idempotency_key=k, **REFUND)
    with pytest.raises(PermanentFailure):
        await client.create_refund(idempotency_key=k, **{**REFUND, "amount_minor": 1501})
    status, body = await admin.post_raw({**REFUND, "amount_minor": 1501}, k)
    assert (status, body) == (409, {"error": "idempotency_key_reused"})
    assert await client.find_refund(k) == first
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 3}


async def test_invalid_requests_are_refused_and_not_applied(
    client: PaymentProvider, admin: Admin
) -> None:
    with pytest.raises(PermanentFailure):
        await client.create_refund(idempotency_key=key(), **{**REFUND, "amount_minor": 0})
    for bad_key in ("", "x" * 201, "line\nbreak"):
        with pytest.raises(PermanentFailure):
            await client.create_refund(idempotency_key=bad_key, **REFUND)
    assert (await admin.post_raw(REFUND, "x" * 201))[0] == 400
    assert (await admin.post_raw({**REFUND, "extra": 1}, key()))[0] == 422
    assert (await admin.post_raw({**REFUND, "amount_minor": "15"}, key()))[0] == 422
    assert (await admin.post_raw(REFUND, None))[0] == 400
    stats = await admin.stats()
    assert (stats["refunds"], stats["by_key"]) == (0, {})


async def test_concurrent_posts_with_one_key_apply_once(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    refunds = await asyncio.gather(
        *(client.create_refund(idempotency_key=k, **REFUND) for _ in range(10))
    )
    assert len({refund.id for refund in refunds}) == 1
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 10}


async def test_unique_keys_apply_once_each(client: PaymentProvider, admin: Admin) -> None:
    keys = [key() for _ in range(5)]
    await asyncio.gather(*(client.create_refund(idempotency_key=k, **REFUND) for k in keys * 2))
    stats = await admin.stats()
    assert stats["refunds"] == 5
    assert stats["by_key"] == dict.fromkeys(keys, 1)


async def test_fail_before_is_transient_and_applies_nothing(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    await admin.faults(fail_before=2)
    for _ in range(2):
        with pytest.raises(TransientFailure):
            await client.create_refund(idempotency_key=k, **REFUND)
    assert await client.find_refund(k) is None
    assert await admin.stats() == {"refunds": 0, "by_key": {}, "posts": 2}
    refund = await client.create_refund(idempotency_key=k, **REFUND)
    assert refund.idempotency_key == k
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 3}


async def test_drop_after_is_unknown_yet_applied_and_found(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    await admin.faults(drop_after=1)
    with pytest.raises(OutcomeUnknown):
        await client.create_refund(idempotency_key=k, **REFUND)
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 1}
    found = await client.find_refund(k)
    assert found is not None
    # Reconciling by replaying the same key yields the same refund, never a second effect.
    assert await client.create_refund(idempotency_key=k, **REFUND) == found
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 2}


async def test_then_down_takes_the_provider_down_as_it_drops_the_answer(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    await admin.faults(drop_after=1, then_down=True)
    with pytest.raises(OutcomeUnknown):
        await client.create_refund(idempotency_key=k, **REFUND)
    assert (await admin.stats())["by_key"] == {k: 1}  # applied …
    with pytest.raises(TransientFailure):
        await client.find_refund(k)  # … and nobody can tell any more
    await admin.clear_faults()
    assert await client.find_refund(k) is not None


async def test_down_makes_create_unknown_and_lookup_transient(
    client: PaymentProvider, admin: Admin
) -> None:
    k = key()
    await admin.faults(down=True)
    with pytest.raises(OutcomeUnknown):
        await client.create_refund(idempotency_key=k, **REFUND)
    with pytest.raises(TransientFailure):
        await client.find_refund(k)
    assert await admin.stats() == {"refunds": 0, "by_key": {}, "posts": 1}
    await admin.clear_faults()
    assert await client.find_refund(k) is None
    await client.create_refund(idempotency_key=k, **REFUND)
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 2}


async def test_nothing_listening_is_transient() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with PaymentProvider(f"http://127.0.0.1:{port}", timeout_seconds=2.0) as client:
        with pytest.raises(TransientFailure):
            await client.create_refund(idempotency_key=key(), **REFUND)
        with pytest.raises(TransientFailure):
            await client.find_refund(key())


async def test_latency_above_the_timeout_is_unknown(base_url: str, admin: Admin) -> None:
    k = key()
    await admin.faults(latency_ms=600)
    async with PaymentProvider(base_url, timeout_seconds=0.2) as slow_client:
        with pytest.raises(OutcomeUnknown):
            await slow_client.create_refund(idempotency_key=k, **REFUND)
        with pytest.raises(TransientFailure):
            await slow_client.find_refund(k)
    # The provider went on and applied it after the client gave up: exactly why the client
    # must report "unknown" rather than "not applied".
    for _ in range(50):
        if (await admin.stats())["refunds"] == 1:
            break
        await asyncio.sleep(0.05)
    assert await admin.stats() == {"refunds": 1, "by_key": {k: 1}, "posts": 1}


async def test_faults_merge_and_reset(admin: Admin, base_url: str) -> None:
    await admin.faults(latency_ms=5)
    await admin.faults(fail_before=3)
    async with admin.session.get(f"{base_url}/_faults") as response:
        assert await response.json() == {
            "latency_ms": 5,
            "fail_before": 3,
            "drop_after": 0,
            "down": False,
            "then_down": False,
        }
    async with admin.session.post(f"{base_url}/_faults", json={"down": "yes"}) as response:
        assert response.status == 422
    await admin.post_raw(REFUND, key())
    async with admin.session.post(f"{base_url}/_reset") as response:
        assert response.status == 200
    assert await admin.stats() == {"refunds": 0, "by_key": {}, "posts": 0}
    async with admin.session.get(f"{base_url}/_faults") as response:
        assert (await response.json())["fail_before"] == 0


async def test_lookup_on_a_wrong_path_is_not_read_as_absent(admin: Admin, base_url: str) -> None:
    async with PaymentProvider(f"{base_url}/v9", timeout_seconds=2.0) as wrong:
        with pytest.raises(PermanentFailure):
            await wrong.find_refund(key())
