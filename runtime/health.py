"""Liveness and readiness of a service: `/healthz` and `/readyz` next to `/metrics`.

- **alive** (`/healthz`, 200 or 503): the process's event loop answers (the handler runs on
  it) and the service's own loop turned within ``health_stale_seconds``; while the service is
  still starting (waiting for a broker or a database it cannot reach yet), it is alive.
  A probe that fails this is a wedged process: restart it.
- **ready** (`/readyz`, 200 or 503): started and connected; the consumer polled within
  ``health_poll_seconds``; at least one partition assigned (a member of a group with more
  members than partitions is not ready: it would idle); and caught up: its lag, summed over
  its partitions, at most ``health_max_lag`` records. Not ready is a signal (traffic,
  rollouts wait for it), never a reason to restart.

Both answer JSON naming each condition, e.g. ``{"ready": false, "why": "no partitions
assigned", "partitions": 0, "lag": null, ...}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiokafka.errors import KafkaError

from config.settings import Settings
from runtime.retry import retrying
from telemetry.metrics import serve_metrics

log = logging.getLogger("ratifier.health")


class Health:
    """What a service's loops report, and what the probes answer from it."""

    def __init__(
        self,
        service: str,
        *,
        stale_seconds: float = 60.0,
        poll_seconds: float = 30.0,
        max_lag: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self._stale = stale_seconds
        self._poll = poll_seconds
        self._max_lag = max_lag
        self._clock = clock
        self._beat: float | None = None
        self._polled: float | None = None
        self.started = False
        self.waiting: str | None = "starting"
        self.partitions = 0
        self.lag: int | None = None

    @classmethod
    def of(cls, service: str, settings: Settings) -> Health:
        return cls(
            service,
            stale_seconds=settings.observability.health_stale_seconds,
            poll_seconds=settings.observability.health_poll_seconds,
            max_lag=settings.observability.health_max_lag,
        )

    # -- what the service reports ---------------------------------------------------------

    def beat(self) -> None:
        """The service's loop turned."""
        self._beat = self._clock()

    def waiting_for(self, why: str) -> None:
        """Not (or no longer) connected: ``why`` (e.g. the broker cannot be reached)."""
        self.waiting = why
        self.beat()

    def running(self) -> None:
        """Started and connected."""
        self.started = True
        self.waiting = None
        self.beat()

    def polled(self) -> None:
        self._polled = self._clock()
        self.beat()

    async def observe(self, consumer: Any) -> None:
        """Assignment and lag of an aiokafka consumer: high watermark as of its
        last fetch minus its position, summed over its partitions."""
        try:
            assigned = consumer.assignment()
        except Exception:  # noqa: BLE001 - not started yet, or stopping
            self.partitions, self.lag = 0, None
            return
        lag = 0
        known = True
        for tp in assigned:
            try:
                highwater = consumer.highwater(tp)
                position = await consumer.position(tp)
            except Exception:  # noqa: BLE001 - a partition moved away mid-refresh
                known = False
                continue
            if highwater is None or position is None:
                known = False  # nothing fetched yet on this partition
                continue
            lag += max(highwater - position, 0)
        self.partitions = len(assigned)
        self.lag = lag if known else None

    # -- what the probes answer -----------------------------------------------------------

    def _age(self, at: float | None) -> float | None:
        return None if at is None else round(self._clock() - at, 3)

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        age = self._age(self._beat)
        alive = not self.started or (age is not None and age <= self._stale)
        return alive, {
            "service": self.service,
            "alive": alive,
            "phase": "running" if self.started else "starting",
            "last_loop_s": age,
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        poll_age = self._age(self._polled)
        why = None
        if self.waiting is not None:
            why = self.waiting
        elif not self.started:
            why = "starting"
        elif poll_age is None or poll_age > self._poll:
            why = f"no poll within {self._poll:g}s"
        elif self.partitions == 0:
            why = "no partitions assigned"
        elif self.lag is not None and self.lag > self._max_lag:
            why = f"lag {self.lag} above {self._max_lag}"
        return why is None, {
            "service": self.service,
            "ready": why is None,
            "why": why,
            "partitions": self.partitions,
            "lag": self.lag,
            "max_lag": self._max_lag,
            "last_poll_s": poll_age,
        }


async def connect_retrying(
    step: Callable[[], Awaitable[object]],
    health: Health,
    *,
    what: str,
    stop: asyncio.Event | None = None,
) -> None:
    """Run a start-up ``step`` (topics, catch-up) until the broker answers, with the backoff
    ladder; meanwhile the service is alive and not ready, and `/readyz` says why. A refusal
    (a ConfigurationError: authentication, TLS trust) is not retried."""

    async def tracked() -> object:
        try:
            return await step()
        except (KafkaError, OSError, TimeoutError) as exc:
            health.waiting_for(f"{what}: {str(exc) or type(exc).__name__}")
            raise

    await retrying(tracked, retry_on=(KafkaError, OSError, TimeoutError), what=what, stop=stop)


def health_response(result: tuple[bool, dict[str, Any]]) -> web.Response:
    ok, body = result
    return web.Response(
        status=200 if ok else 503, text=json.dumps(body), content_type="application/json"
    )


def add_health_routes(app: web.Application, health: Health) -> None:
    """`/healthz` and `/readyz` on an aiohttp app the service already serves."""

    async def healthz(_request: web.Request) -> web.Response:
        return health_response(health.liveness())

    async def readyz(_request: web.Request) -> web.Response:
        return health_response(health.readiness())

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


async def serve_health(host: str, port: int, health: Health) -> Callable[[], Awaitable[None]]:
    """Serve `/healthz`, `/readyz` and `/metrics` on ``host:port`` (0: nothing); return the
    closer. A port in use is logged, not fatal (as for metrics)."""
    return await serve_metrics(
        host, port, more_routes=lambda app: add_health_routes(app, health), what="health"
    )
