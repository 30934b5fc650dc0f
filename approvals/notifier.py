"""`ratifier notifier`: approval requests delivered to per-tenant webhook endpoints, signed,
retried with backoff, dead-lettered after a bound (docs/notifications.md).

Two halves, one process:

- the **consumer** (its own group on `approvals.requested`, the runtime's consumer loop)
  writes every notification a request owes into the PostgreSQL outbox
  (`notification_deliveries`), idempotent on the delivery id, and only then are the offsets
  committed: a restart loses nothing and a redelivered request adds nothing;
- the **dispatcher** runs one task per tenant: it claims that tenant's due deliveries
  (``FOR UPDATE SKIP LOCKED``, leased, so notifiers scale out and a crash mid-send is retried
  after the lease), sends them concurrently, each within ``timeout_seconds``, and records the
  result: delivered (2xx), another attempt after the backoff, or dead after the bound, whose
  dead letter (`notifications.deadletter`) is published, acknowledged, then marked. One slow
  or failing endpoint costs its own tenant's slots at most one timeout per attempt and other
  tenants nothing.

Database and broker outages fail a dispatcher cycle only; it is retried on the runtime's
backoff ladder and the process never exits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

import aiohttp
import psycopg
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError

from approvals.notify import (
    Delivery,
    Directory,
    Endpoint,
    RetryPolicy,
    after_failure,
    deliveries_for,
    short_error,
    sign,
)
from commands.sql import named_query
from config.settings import Settings
from runtime.clients import (
    database_conninfo,
    pg_pool,
)
from runtime.health import Health
from runtime.loop import ConsumerLoop, Handled, consumer_loop
from runtime.retry import Stopped, pause, retrying
from runtime.shell import ServiceShell, ShellWorker, StartupHook, run_until
from runtime.startup import DEPENDENCY_ERRORS, KafkaClients, open_pool
from runtime.supervision import SideTask
from schemas.envelopes import ApprovalRequest, DecisionKind, NotificationDeadLetter
from schemas.errors import StorageUnavailable
from schemas.names import DELIVERY_HEADER, NOTIFIER_GROUP, SIGNATURE_HEADER, Topic
from telemetry.metrics import count_notification, set_notifications_pending

log = logging.getLogger("ratifier.notifier")
_PKG = "approvals"
CONNECT_TIMEOUT_SECONDS = 5.0
DEAD_LETTER_BATCH = 100
MAX_DISPATCH_CONNECTIONS = 14
METRICS_REFRESH_SECONDS = 5.0
# A claimed delivery's lease beyond its attempt's timeout: after it, a delivery whose notifier
# died mid-send is due again.
LEASE_MARGIN_SECONDS = 30.0
USER_AGENT = "ratifier-notifier/1"


def retry_policy(settings: Settings) -> RetryPolicy:
    n = settings.notifications
    return RetryPolicy(
        backoff_seconds=n.backoff_seconds,
        backoff_cap_seconds=n.backoff_cap_seconds,
        max_attempts=n.max_attempts,
        max_age_seconds=n.max_age_seconds,
    )


def dead_letter(row: dict[str, Any], tenant: str) -> NotificationDeadLetter:
    return NotificationDeadLetter(
        delivery_id=row["delivery_id"],
        call_id=row["call_id"],
        tenant=tenant,
        endpoint=row["endpoint"],
        kind=DecisionKind(row["kind"]),
        attempts=row["attempts"],
        last_error=row["last_error"],
        first_queued_at=row["created_at"],
        at=row["dead_at"] or datetime.now(UTC),
    )


class Notifier(ShellWorker):
    """The consumer and the dispatcher of one notifier process, in the service shell."""

    service = "notifier"
    retry_on = DEPENDENCY_ERRORS

    def __init__(
        self,
        settings: Settings,
        directory: Directory,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._directory = directory
        self._policy = retry_policy(settings)
        self._clock = clock
        self.health = Health.of("notifier", settings)
        self.stopping = asyncio.Event()
        self._loop: ConsumerLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._kafka = KafkaClients(
            settings,
            settings.topic(Topic.APPROVALS_REQUESTED),
            group=settings.group(NOTIFIER_GROUP),
        )
        self._session: aiohttp.ClientSession | None = None
        self._pending: dict[str, tuple[int, float]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self.sent = 0  # attempts answered 2xx by this process

    def stop(self) -> None:
        self.stopping.set()
        if self._loop is not None:
            self._loop.stop()

    # -- the consumer: requests into the outbox ------------------------------------------

    async def _enqueue(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> list[Handled]:
        """The notifications each request owes, written in one transaction per batch (the
        loop commits the offsets after it). A record that is not an approval request is
        dead-lettered by the loop (`calls.deadletter`), the others go on."""
        results: list[Handled] = []
        owed: list[Delivery] = []
        for record in records:
            try:
                request = ApprovalRequest.model_validate_json(record.value or b"")
            except ValidationError as exc:
                results.append(
                    Handled(failure=f"not an approval request: {exc.error_count()} errors")
                )
                continue
            deliveries = deliveries_for(
                request, self._directory, dashboard_url=self._settings.notifications.dashboard_url
            )
            count_notification("queued" if deliveries else "no_endpoint", max(len(deliveries), 1))
            owed.extend(deliveries)
            results.append(Handled(observe=False))
        if owed:
            await self._insert(owed)
            # This process's dispatchers look at once (others find them on their next poll).
            for tenant in {d.tenant for d in owed}:
                self._wake_up(tenant).set()
        return results

    def _wake_up(self, tenant: str) -> asyncio.Event:
        return self._wake.setdefault(tenant, asyncio.Event())

    async def _idle(self, tenant: str, seconds: float) -> None:
        """Wait until new deliveries of ``tenant`` are queued here, or ``seconds`` passed
        (retries come due, another notifier queued some)."""
        wake = self._wake_up(tenant)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=seconds)
        wake.clear()

    async def _insert(self, owed: Sequence[Delivery]) -> None:
        try:
            pool = await self._connect()
            async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                await cur.executemany(
                    named_query(_PKG, "insert_delivery"),
                    [
                        {
                            "tenant": d.tenant,
                            "delivery_id": d.delivery_id,
                            "call_id": d.call_id,
                            "endpoint": d.endpoint,
                            "kind": d.kind.value,
                            "body": d.body.decode(),
                            "expires_at": d.expires_at,
                        }
                        for d in owed
                    ],
                )
        except (psycopg.OperationalError, PoolTimeout) as exc:
            await self._drop_pool()
            raise StorageUnavailable("PostgreSQL is not reachable for the outbox.") from exc

    # -- the dispatcher: due deliveries out ------------------------------------------------

    async def _tenant_dispatcher(self, tenant: str) -> None:
        """Send ``tenant``'s due deliveries until stopped; a failed cycle (database, broker)
        is retried with the backoff ladder."""
        idle = self._settings.notifications.poll_seconds
        while not self.stopping.is_set():
            try:
                busy = await retrying(
                    partial(self._cycle, tenant),
                    retry_on=DEPENDENCY_ERRORS,
                    what=f"notifier dispatch ({tenant})",
                    stop=self.stopping,
                )
                self.health.beat()
                if not busy:
                    await self._idle(tenant, idle)
            except Stopped:
                return
            except Exception:
                # A bug must not end this tenant's dispatch silently: logged, then tried again.
                log.exception("notifier dispatch for tenant %s failed", tenant)
                try:
                    await pause(idle * 10, self.stopping)
                except Stopped:
                    return

    async def _cycle(self, tenant: str) -> bool:
        """One round for ``tenant``: publish owed dead letters, expire what outlived its
        request, claim and send what is due. True when it sent something (look again at once)."""
        pool = await self._connect()
        try:
            await self._publish_dead_letters(pool, tenant)
            async with pool.connection() as conn:
                await conn.execute(named_query(_PKG, "expire_deliveries"), {"tenant": tenant})
                rows = await (
                    await conn.execute(
                        named_query(_PKG, "claim_due_deliveries"),
                        {
                            "tenant": tenant,
                            "limit": self._settings.notifications.concurrency_per_tenant,
                            "lease_seconds": self._settings.notifications.timeout_seconds
                            + LEASE_MARGIN_SECONDS,
                        },
                    )
                ).fetchall()
            if rows:
                # Every attempt runs to its end (its result recorded) before a failure of one
                # of them fails the cycle.
                results = await asyncio.gather(
                    *(self._attempt(pool, tenant, row) for row in rows), return_exceptions=True
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                await self._publish_dead_letters(pool, tenant)
            await self._refresh_pending(pool, tenant)
        except (psycopg.OperationalError, PoolTimeout):
            await self._drop_pool()
            raise
        return bool(rows)

    async def _attempt(
        self, pool: AsyncConnectionPool[Any], tenant: str, row: dict[str, Any]
    ) -> None:
        """One attempt of one delivery, and its result recorded."""
        endpoint = self._directory.endpoint(tenant, row["endpoint"])
        status: int | None = None
        error: str | None = "endpoint no longer configured"
        if endpoint is not None:
            status, error = await self._post(endpoint, row["delivery_id"], row["body"].encode())
        if error is None:
            count_notification("delivered")
            self.sent += 1
            query = named_query(_PKG, "mark_delivered")
            params: dict[str, Any] = {"last_status": status}
        else:
            decided = after_failure(
                self._policy,
                attempts=row["attempts"],
                queued_at=row["created_at"],
                now=datetime.now(UTC),
            )
            common: dict[str, Any] = {
                "last_status": status,
                "last_error": short_error(
                    error,
                    url=endpoint.url if endpoint is not None else "",
                    name=row["endpoint"],
                ),
            }
            if decided.dead:
                query, params = named_query(_PKG, "mark_dead"), common
            else:
                query, params = (
                    named_query(_PKG, "mark_retry"),
                    common | {"retry_at": decided.retry_at},
                )
            log.info(
                "delivery %s (tenant %s, endpoint %s) attempt %d failed: %s%s",
                row["delivery_id"],
                tenant,
                row["endpoint"],
                row["attempts"],
                common["last_error"],
                "; dead-lettered" if decided.dead else "",
            )
            count_notification("dead" if decided.dead else "retried")
        async with pool.connection() as conn:
            await conn.execute(
                query, params | {"tenant": tenant, "delivery_id": row["delivery_id"]}
            )

    async def _post(
        self, endpoint: Endpoint, delivery: str, body: bytes
    ) -> tuple[int | None, str | None]:
        """POST ``body`` signed now; (HTTP status, None) on a 2xx answer, else why not. Never
        follows a redirect (the endpoint is what the tenant declared)."""
        session = self._http()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            DELIVERY_HEADER: delivery,
            SIGNATURE_HEADER: sign(endpoint.secret, body, int(self._clock())),
        }
        try:
            async with session.post(
                endpoint.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.read()
                if 200 <= response.status < 300:
                    return response.status, None
                return response.status, f"HTTP {response.status}"
        except TimeoutError:
            return None, f"no answer within {self._settings.notifications.timeout_seconds:g}s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"

    async def _publish_dead_letters(self, pool: AsyncConnectionPool[Any], tenant: str) -> None:
        """Publish the tenant's dead letters not yet acknowledged, then mark them."""
        async with pool.connection() as conn:
            rows = await (
                await conn.execute(
                    named_query(_PKG, "unpublished_dead_letters"),
                    {"tenant": tenant, "limit": DEAD_LETTER_BATCH},
                )
            ).fetchall()
        if not rows:
            return
        producer = self._kafka.producer
        assert producer is not None
        topic = self._settings.topic(Topic.NOTIFICATIONS_DEADLETTER)
        sent = []
        for row in rows:
            letter = dead_letter(row, tenant)
            sent.append(
                await producer.send(topic, key=letter.call_id.encode(), value=letter.to_bytes())
            )
        await asyncio.gather(*sent)
        async with pool.connection() as conn:
            await conn.execute(
                named_query(_PKG, "mark_dead_letters_published"),
                {"tenant": tenant, "delivery_ids": [r["delivery_id"] for r in rows]},
            )
        count_notification("dead_letter_published", len(rows))

    async def _refresh_pending(self, pool: AsyncConnectionPool[Any], tenant: str) -> None:
        due = self._pending.get(tenant, (0, 0.0))[1]
        if time.monotonic() < due:
            return
        async with pool.connection() as conn:
            row = await (
                await conn.execute(named_query(_PKG, "pending_deliveries"), {"tenant": tenant})
            ).fetchone()
        assert row is not None
        self._pending[tenant] = (int(row["pending"]), time.monotonic() + METRICS_REFRESH_SECONDS)
        set_notifications_pending(sum(n for n, _ in self._pending.values()))

    # -- connections ---------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._settings.notifications.timeout_seconds),
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=16),
            )
        return self._session

    async def _connect(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            pool = pg_pool(
                database_conninfo(self._settings),
                # the consumer, and each tenant's dispatcher recording its attempts' results
                max_size=2 + min(len(self._directory.tenants), MAX_DISPATCH_CONNECTIONS),
                dict_rows=True,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
            )
            self._pool = await open_pool(pool, wait_seconds=CONNECT_TIMEOUT_SECONDS)
        return self._pool

    async def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(timeout=1.0)

    def wire(self, shell: ServiceShell) -> None:
        """After ``prepare``: the broker and the database waited for (retried, not ready
        meanwhile), one supervised dispatcher per tenant (a dispatcher that dies stops the
        process), clients closed last."""
        shell.on_startup.append(StartupHook(name="broker", run=self._kafka.start))
        shell.on_startup.append(StartupHook(name="database", run=self._connect))
        for tenant in self._directory.tenants:
            shell.side_tasks.append(
                SideTask(name=f"notify-{tenant}", run=partial(self._tenant_dispatcher, tenant))
            )
        shell.on_shutdown.append(self._close_clients)

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: the consumer loop until ``stop`` is set."""
        settings = self._settings
        assert self._kafka.consumer is not None
        loop = self._loop = consumer_loop(
            settings,
            self._kafka.consumer,
            self._kafka.producer,
            stage="notify",
            group=settings.group(NOTIFIER_GROUP),
            handle=self._enqueue,
            answers=None,
            retry_on=(StorageUnavailable,),
            poll_ms=500,
            health=self.health,
        )
        log.info(
            "notifier started on %s for %d tenant(s)",
            settings.topic(Topic.APPROVALS_REQUESTED),
            len(self._directory.tenants),
        )
        await run_until(loop, stop)

    async def _close_clients(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self._drop_pool()
        await self._kafka.stop()


async def run_notifier(
    settings: Settings,
    directory: Directory,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Serve health at once; start (retried until the database and the broker answer); run
    until SIGTERM / SIGINT; the exit code."""
    notifier = Notifier(settings, directory)
    shell = notifier.shell(
        prepare, http_port=settings.notifications.metrics_port, handle_signals=True
    )
    return await shell.run(notifier.consume)
