"""The notifier on real Kafka and PostgreSQL (docs/notifications.md): approval requests
published to `approvals.requested` (as the approval-join would) reach a webhook receiver on a
loopback port, signed; a receiver that answers 500 sees the same delivery again after the
backoff; an endpoint that never answers in time is dead-lettered after the bound while
another tenant's deliveries still arrive promptly; a notifier stopped and started again loses
nothing and sends nothing twice."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from approvals.notifier import Notifier
from approvals.notify import Directory, Endpoint, verify_signature
from commands.sql import named_query
from config.settings import Settings
from ratifier.processes import start_worker
from runtime.clients import kafka_consumer, kafka_producer
from schemas.envelopes import ApprovalRequest, DecisionKind, Effect, NotificationDeadLetter
from schemas.names import DELIVERY_HEADER, SIGNATURE_HEADER, Topic
from tests.services import worker_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET_A = b"whsec-tenant-a-0123456789"
SECRET_SLOW = b"whsec-tenant-slow-0123456789"
MAX_ATTEMPTS = 3
TIMEOUT_SECONDS = 1.0


@dataclass
class Received:
    delivery_id: str
    body: dict[str, Any]
    signed: bool
    at: float
    # The header is exactly the documented scheme over the bytes received, checked without
    # ratifier's helper (which signer and verifier share): `t=<now>,v1=<HMAC-SHA256>`.
    exact: bool = False


def documented_signature(secret: bytes, header: str | None, body: bytes) -> bool:
    """``header`` is ``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` with a
    ``t`` within a minute of now (docs/notifications.md), computed here with hmac alone."""
    stamp = re.fullmatch(r"t=(\d+),v1=[0-9a-f]{64}", header or "")
    if stamp is None or abs(time.time() - int(stamp.group(1))) > 60:
        return False
    mac = hmac.new(secret, stamp.group(1).encode() + b"." + body, hashlib.sha256).hexdigest()
    return header == f"t={stamp.group(1)},v1={mac}"


@dataclass
class Receiver:
    """A webhook receiver: verifies each signature, records each request, answers 500 to the
    first ``fail_first[call_id]`` attempts of a call, and never answers in time on /slow."""

    fail_first: dict[str, int] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    slow_hits: int = 0
    stalled: asyncio.Event = field(default_factory=asyncio.Event)

    async def ok(self, request: web.Request) -> web.Response:
        raw = await request.read()
        signed = verify_signature(
            SECRET_A, request.headers.get(SIGNATURE_HEADER), raw, time.time(), tolerance=300
        )
        body = json.loads(raw)
        exact = documented_signature(SECRET_A, request.headers.get(SIGNATURE_HEADER), raw)
        self.received.append(
            Received(request.headers[DELIVERY_HEADER], body, signed, time.monotonic(), exact)
        )
        if not signed:
            return web.Response(status=401)
        seen = sum(1 for r in self.received if r.body["call_id"] == body["call_id"])
        if seen <= self.fail_first.get(body["call_id"], 0):
            return web.Response(status=500, text="not now")
        return web.Response(status=204)

    async def slow(self, request: web.Request) -> web.Response:
        await request.read()
        self.slow_hits += 1
        await self.stalled.wait()  # longer than the notifier waits
        return web.Response(status=204)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    state = Receiver()
    app = web.Application()
    app.router.add_post("/hook", state.ok)
    app.router.add_post("/slow", state.slow)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        state.stalled.set()
        await runner.cleanup()


def notifier_settings(settings: Settings) -> Settings:
    return settings.changed(
        notifications={
            "timeout_seconds": TIMEOUT_SECONDS,
            "backoff_seconds": 0.3,
            "backoff_cap_seconds": 1.0,
            "max_attempts": MAX_ATTEMPTS,
            "poll_seconds": 0.1,
            "metrics_port": 0,
            "dashboard_url": "https://ratifier.example/",
        }
    )


def approval_request(tenant: str, call_id: str, subject: str | None = None) -> ApprovalRequest:
    return ApprovalRequest(
        call_id=call_id,
        operation_id=f"op-{call_id}",
        tenant=tenant,
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": 500},
        preview=(f"Refund 5.00 EUR of pay_A1001 ({call_id})",),
        fingerprint="f" * 64,
        effect=Effect.EXTERNAL_WRITE,
        policy_version="pv-test",
        requested_by="agent-7",
        expires_at=datetime.now(UTC) + timedelta(minutes=15),
        subject=subject,
    )


async def publish(settings: Settings, requests: list[ApprovalRequest]) -> None:
    producer = kafka_producer(settings)
    await producer.start()
    try:
        for r in requests:
            await producer.send_and_wait(
                settings.topic(Topic.APPROVALS_REQUESTED),
                key=r.call_id.encode(),
                value=r.to_bytes(),
            )
    finally:
        await producer.stop()


async def until(
    condition: Callable[[], Awaitable[bool] | bool], *, timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def rows_of(
    pool: AsyncConnectionPool[Any], tenant: str, call_id: str
) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            named_query("approvals", "deliveries_of_call"), {"tenant": tenant, "call_id": call_id}
        )
        return list(await cur.fetchall())


async def dead_letters(settings: Settings, call_ids: set[str]) -> list[NotificationDeadLetter]:
    consumer = kafka_consumer(settings, settings.topic(Topic.NOTIFICATIONS_DEADLETTER), group=None)
    await consumer.start()
    try:
        found: list[NotificationDeadLetter] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and {d.call_id for d in found} != call_ids:
            for batch in (await consumer.getmany(timeout_ms=300)).values():
                for record in batch:
                    letter = NotificationDeadLetter.model_validate_json(record.value or b"")
                    if letter.call_id in call_ids:
                        found.append(letter)
        return found
    finally:
        await consumer.stop()


class Running:
    """A notifier running in this process (its consumer loop and dispatchers)."""

    def __init__(self, settings: Settings, directory: Directory) -> None:
        self.notifier = Notifier(settings, directory)
        self.task = asyncio.create_task(self.notifier.run())

    async def stop(self) -> None:
        self.notifier.stop()
        await asyncio.wait_for(self.task, timeout=30)


def directory_for(base_url: str, tenant_a: str, tenant_slow: str) -> Directory:
    return Directory(
        {
            tenant_a: (
                Endpoint(
                    tenant=tenant_a,
                    name="ops",
                    url=f"{base_url}/hook",
                    secret=SECRET_A,
                    kinds=frozenset({DecisionKind.APPROVER, DecisionKind.CONFIRMATION}),
                ),
            ),
            tenant_slow: (
                Endpoint(
                    tenant=tenant_slow,
                    name="stuck",
                    url=f"{base_url}/slow",
                    secret=SECRET_SLOW,
                    kinds=frozenset({DecisionKind.APPROVER}),
                ),
            ),
        }
    )


@dataclass(frozen=True)
class Webhooks:
    """A test's receiver and two tenants of its own: ``tenant_a``'s endpoints answer (or fail
    as told), ``tenant_slow``'s never does."""

    state: Receiver
    settings: Settings
    run_id: str
    tenant_a: str
    tenant_slow: str
    directory: Directory


@pytest.fixture
def webhooks(settings: Settings, topics: list[str], receiver: tuple[Receiver, str]) -> Webhooks:
    state, base_url = receiver
    run_id = uuid.uuid4().hex[:8]
    tenant_a, tenant_slow = f"wh-{run_id}-a", f"wh-{run_id}-slow"
    return Webhooks(
        state=state,
        settings=notifier_settings(settings),
        run_id=run_id,
        tenant_a=tenant_a,
        tenant_slow=tenant_slow,
        directory=directory_for(base_url, tenant_a, tenant_slow),
    )


async def test_every_request_arrives_signed_retried_after_500_and_dead_lettered_after_the_bound(
    webhooks: Webhooks, pool: AsyncConnectionPool[Any]
) -> None:
    state, settings, run_id = webhooks.state, webhooks.settings, webhooks.run_id
    tenant_a, tenant_slow = webhooks.tenant_a, webhooks.tenant_slow
    calls = [f"wh-{run_id}-{n}" for n in range(4)]
    flaky = calls[0]
    state.fail_first[flaky] = 2  # two 500s, then accepted
    stuck = [f"wh-{run_id}-stuck-{n}" for n in range(2)]

    running = Running(settings, webhooks.directory)
    try:
        # The stuck tenant's requests first: its endpoint must not hold tenant-a's back.
        await publish(settings, [approval_request(tenant_slow, c) for c in stuck])
        await until(lambda: state.slow_hits >= 1, timeout=30, what="the slow endpoint tried")
        published_at = time.monotonic()
        await publish(
            settings,
            [
                approval_request(tenant_a, c, subject="cust-42" if c == calls[1] else None)
                for c in calls
            ],
        )

        expected = {c: 3 if c == flaky else 2 if c == calls[1] else 1 for c in calls}
        await until(
            lambda: all(_attempts(state, c) >= n for c, n in expected.items()),
            timeout=30,
            what="every request received (the flaky one three times)",
        )
        # Every request arrived, each signature verified, within the slow tenant's first
        # timeouts: one stuck endpoint did not delay another tenant.
        assert all(r.signed and r.exact for r in state.received)
        first_arrival = {
            c: min(r.at for r in state.received if r.body["call_id"] == c) for c in calls
        }
        assert max(first_arrival.values()) - published_at < 5.0

        # The flaky one: three attempts, one delivery id, delivered at last.
        attempts = [r for r in state.received if r.body["call_id"] == flaky]
        assert len(attempts) == 3
        assert len({r.delivery_id for r in attempts}) == 1
        assert attempts[0].body == attempts[-1].body
        assert attempts[0].body["decide_url"] == f"https://ratifier.example/?call={flaky}"

        # The call naming a subject went out twice: to approvers and for confirmation.
        kinds = {r.body["kind"] for r in state.received if r.body["call_id"] == calls[1]}
        assert kinds == {"approver", "confirmation"}

        async def all_delivered() -> bool:
            rows = [row for c in calls for row in await rows_of(pool, tenant_a, c)]
            return len(rows) == len(calls) + 1 and all(r["status"] == "delivered" for r in rows)

        await until(all_delivered, timeout=10, what="tenant-a's rows marked delivered")
        (flaky_row,) = await rows_of(pool, tenant_a, flaky)
        assert flaky_row["attempts"] == 3 and flaky_row["last_status"] == 204

        # The stuck endpoint: dead after MAX_ATTEMPTS timeouts, a dead letter for each.
        letters = await dead_letters(settings, set(stuck))
        assert {d.call_id for d in letters} == set(stuck)
        assert all(
            d.tenant == tenant_slow and d.endpoint == "stuck" and d.attempts == MAX_ATTEMPTS
            for d in letters
        )
        assert all(d.last_error and "no answer within" in d.last_error for d in letters)

        async def marked_dead() -> bool:
            rows = [row for c in stuck for row in await rows_of(pool, tenant_slow, c)]
            return len(rows) == len(stuck) and all(
                r["status"] == "dead" and r["dead_letter_published_at"] is not None for r in rows
            )

        # marked after the broker acknowledged the dead letter (which the test read already)
        await until(marked_dead, timeout=10, what="the stuck rows dead, their letters marked")
    finally:
        await running.stop()

    # Nothing was sent again after it was accepted.
    assert {c: _attempts(state, c) for c in calls} == expected


def _attempts(state: Receiver, call_id: str) -> int:
    return sum(1 for r in state.received if r.body["call_id"] == call_id)


async def test_a_request_published_while_the_notifier_is_down_is_delivered_once_after_restart(
    webhooks: Webhooks, pool: AsyncConnectionPool[Any]
) -> None:
    state, settings, run_id = webhooks.state, webhooks.settings, webhooks.run_id
    tenant_a, directory = webhooks.tenant_a, webhooks.directory
    before, during = f"wh-{run_id}-before", f"wh-{run_id}-during"

    running = Running(settings, directory)
    await publish(settings, [approval_request(tenant_a, before)])
    await until(
        lambda: any(r.body["call_id"] == before for r in state.received),
        timeout=30,
        what="the first request received",
    )
    await running.stop()

    await publish(settings, [approval_request(tenant_a, during)])
    running = Running(settings, directory)
    try:
        await until(
            lambda: any(r.body["call_id"] == during for r in state.received),
            timeout=30,
            what="the request published while down",
        )

        async def settled() -> bool:
            rows = await rows_of(pool, tenant_a, during)
            return len(rows) == 1 and rows[0]["status"] == "delivered"

        await until(settled, timeout=10, what="its row marked delivered")
    finally:
        await running.stop()
    # The request consumed before the restart was not delivered again.
    assert [r.body["call_id"] for r in state.received].count(before) == 1
    assert [r.body["call_id"] for r in state.received].count(during) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_notifier_process_reads_its_endpoints_file_and_delivers(
    settings: Settings,
    topics: list[str],
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    """`ratifier notifier` as a process: endpoints from the file, the secret from the
    environment, a delivery verified by the receiver, counted on /metrics."""
    state, base_url = receiver
    run_id = uuid.uuid4().hex[:8]
    tenant = f"wh-{run_id}-p"
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "tenants": {
                    tenant: [
                        {"name": "ops", "url": f"{base_url}/hook", "secret_env": "WH_TEST_SECRET"}
                    ]
                }
            }
        )
    )
    port = free_port()
    env = worker_env(settings) | {
        "RATIFIER_NOTIFICATIONS__ENDPOINTS_FILE": str(endpoints),
        "RATIFIER_NOTIFICATIONS__METRICS_PORT": str(port),
        "RATIFIER_NOTIFICATIONS__POLL_SECONDS": "0.1",
    }
    log_dir = Path("test-artifacts/integration-logs")

    # Without its secret the notifier refuses to start (it never sends unsigned).
    refused = start_worker("notifier", name=f"notifier-nosecret-{run_id}", log_dir=log_dir, env=env)
    try:
        await until(lambda: refused.process.poll() is not None, timeout=60, what="a refusal")
    finally:
        refused.stop()
    assert refused.process.returncode != 0
    assert "$WH_TEST_SECRET is not set" in refused.log_tail()

    worker = start_worker(
        "notifier",
        name=f"notifier-{run_id}",
        log_dir=log_dir,
        env=env | {"WH_TEST_SECRET": SECRET_A.decode()},
    )
    try:
        call_id = f"wh-{run_id}-proc"
        await publish(settings, [approval_request(tenant, call_id)])
        await until(
            lambda: any(r.body["call_id"] == call_id for r in state.received),
            timeout=60,
            what=f"the process's delivery (log: {worker.log_path})",
        )
        (got,) = [r for r in state.received if r.body["call_id"] == call_id]
        assert got.signed and got.exact and got.body["tenant"] == tenant

        async def counted() -> bool:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/metrics") as response,
            ):
                text = await response.text()
            return 'ratifier_notifications_total{result="delivered"}' in text

        await until(counted, timeout=10, what="the delivery counted on /metrics")
    finally:
        code = worker.stop()
    assert code == 0, worker.log_tail()
