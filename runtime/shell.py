"""The one service shell every worker runs in: health served at once, start-up hooks waited
out with one policy, supervised side tasks, signals, and a close in reverse order.

    shell = ServiceShell("stages", health=health, http_port=port)
    shell.on_startup.append(StartupHook(name="Kafka topics", run=create_topics))
    shell.side_tasks.append(SideTask(name="policy feed", run=feed.follow))
    shell.on_shutdown.append(storage.close)
    return await shell.run(consume)   # consume(stop_event) is the service itself

The policy for a service that is down at start (broker, database): the hook is retried with
the runtime's backoff (runtime/retry.py) for as long as it takes, meanwhile the process is
alive, `/readyz` says not ready and why, and the log says what it waits for. A hook that fails
with anything else (a ConfigurationError: a schema behind the build, a refused login) stops
the start. A side task that dies stops the service (or restarts, if declared restartable;
runtime/supervision.py). SIGTERM/SIGINT stop the service: ``main`` gets its stop event set and
``grace_seconds`` to finish its batch, then side tasks and ``on_shutdown`` closers run, last
registered first.

The shape is FastStream's on_startup/after_startup/on_shutdown lists, procrastinate's side
tasks and Temporal's Worker.run()/shutdown().
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from aiohttp import web
from aiokafka.errors import KafkaError

from config.settings import Settings
from runtime.health import Health, add_health_routes
from runtime.heap import settle_heap
from runtime.retry import Stopped, backoff, pause
from runtime.signals import stop_on_signals
from runtime.supervision import SideTask, Supervisor
from schemas.errors import StorageUnavailable
from telemetry.metrics import serve_metrics

log = logging.getLogger("ratifier.runtime")

# What "a service is down" looks like to a start-up hook: retried, never fatal.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    KafkaError,
    OSError,
    TimeoutError,
    StorageUnavailable,
)
GRACE_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True)
class StartupHook:
    """``run`` must succeed before the service starts; ``name`` says what it waits for
    (shown on `/readyz` and in the log while it does)."""

    name: str
    run: Callable[[], Awaitable[object]]


class Stoppable(Protocol):
    """A loop that runs until asked to stop (runtime/loop.py's ConsumerLoop)."""

    def stop(self) -> None: ...

    async def run(self) -> None: ...


async def run_until(loop: Stoppable, stop: asyncio.Event) -> None:
    """Run ``loop`` as a shell's main: ``stop`` (the shell's stop event) asks it to stop,
    and it finishes its batch within the shell's grace period."""
    stopper = asyncio.create_task(stop.wait())
    stopper.add_done_callback(lambda _done: loop.stop())
    try:
        await loop.run()
    finally:
        stopper.cancel()


Routes = Callable[[web.Application], None]
Main = Callable[[asyncio.Event], Coroutine[Any, Any, object]]


@dataclass(kw_only=True)
class ServiceShell:
    """One worker process's lifecycle around its ``main`` (see the module docstring)."""

    service: str
    health: Health
    http_host: str = "127.0.0.1"
    http_port: int = 0
    routes: list[Routes] = field(default_factory=list)
    on_startup: list[StartupHook] = field(default_factory=list)
    after_startup: list[Callable[[], Awaitable[object]]] = field(default_factory=list)
    side_tasks: list[SideTask] = field(default_factory=list)
    on_shutdown: list[Callable[[], Awaitable[object]]] = field(default_factory=list)
    grace_seconds: float = GRACE_SECONDS
    retry_on: tuple[type[BaseException], ...] = UNAVAILABLE
    backoff_of: Callable[[int], float] = backoff
    handle_signals: bool = True
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Why the service stopped on its own (a dead side task, a failed main), else None.
    failure: str | None = None

    def shutdown(self) -> None:
        """Ask the service to stop (as SIGTERM does)."""
        self.stopping.set()

    async def run(self, main: Main) -> int:
        """Serve health, wait out the start-up hooks, run ``main`` with the side tasks until
        it ends or a stop is asked, then close; the exit code (0: stopped as asked)."""
        if self.handle_signals:
            stop_on_signals(self.shutdown)
        close_http = await serve_metrics(
            self.http_host, self.http_port, more_routes=self._mount, what=self.service
        )
        supervisor = Supervisor(
            service=self.service,
            stopping=self.stopping,
            on_death=self.shutdown,
            backoff_of=self.backoff_of,
        )
        try:
            if not await self._start_up():
                return 0 if self.failure is None else 1
            for side in self.side_tasks:
                supervisor.start(side)
            settle_heap(self.service)
            log.info("%s started", self.service)
            await self._run_main(main)
        finally:
            await supervisor.close()
            await self._close()
            await close_http()
        if supervisor.failure is not None and self.failure is None:
            self.failure = supervisor.failure
        if self.failure is not None:
            log.error("%s stopped: %s", self.service, self.failure)
            return 1
        log.info("%s stopped", self.service)
        return 0

    def _mount(self, app: web.Application) -> None:
        add_health_routes(app, self.health)
        for routes in self.routes:
            routes(app)

    async def _start_up(self) -> bool:
        """Run every hook until it passes; False if a stop came first (or a hook refused)."""
        for hook in self.on_startup:
            attempt = 0
            while True:
                if self.stopping.is_set():
                    return False
                try:
                    await hook.run()
                    break
                except self.retry_on as exc:
                    why = f"{hook.name}: {str(exc) or type(exc).__name__}"
                    self.health.waiting_for(why)
                    delay = self.backoff_of(attempt)
                    attempt += 1
                    log.warning(
                        "%s waits for %s; retry %d in %.1fs", self.service, why, attempt, delay
                    )
                    try:
                        await pause(delay, self.stopping)
                    except Stopped:
                        return False
        for after in self.after_startup:
            await after()
        return True

    async def _run_main(self, main: Main) -> None:
        task = asyncio.create_task(main(self.stopping), name=f"{self.service} main")
        stop = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                # Asked to stop: main sees the event and gets the grace period to finish.
                done, _ = await asyncio.wait({task}, timeout=self.grace_seconds)
                if not done:
                    log.warning(
                        "%s still busy after %.0fs; cancelled", self.service, self.grace_seconds
                    )
                    task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception as exc:
                self.failure = f"{type(exc).__name__}: {exc}"
                log.exception("%s failed", self.service)
            else:
                if not self.stopping.is_set() and self.failure is None:
                    self.failure = "its main task returned"
        finally:
            stop.cancel()
            self.stopping.set()

    async def _close(self) -> None:
        """``on_shutdown`` closers, last registered first; one failing does not skip the rest."""
        for close in reversed(self.on_shutdown):
            try:
                await close()
            except Exception:
                log.exception("%s: closing failed", self.service)


class ShellWorker:
    """A Kafka worker that runs in the shell (the audit sink, the notifier, the reconciler):
    ``shell()`` serves its health on the metrics host, runs ``prepare`` (the schema check and
    topics) as the first start-up hook and then what ``wire`` adds; ``consume`` is its main.

    A subclass sets ``service`` (and ``retry_on`` when more than the broker and the socket
    can be away at start) and, in its constructor, ``_settings``, ``health`` and ``stopping``.
    """

    service: ClassVar[str]
    retry_on: ClassVar[tuple[type[BaseException], ...]] = UNAVAILABLE
    _settings: Settings
    health: Health
    stopping: asyncio.Event

    def wire(self, shell: ServiceShell) -> None:
        """Add this worker's start-up hooks, side tasks and closers to ``shell``."""
        raise NotImplementedError

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: run until ``stop`` is set."""
        raise NotImplementedError

    def shell(
        self,
        prepare: Callable[[], Awaitable[object]] | None = None,
        *,
        http_port: int = 0,
        handle_signals: bool = False,
    ) -> ServiceShell:
        shell = ServiceShell(
            service=self.service,
            health=self.health,
            http_host=self._settings.observability.metrics_host,
            http_port=http_port,
            retry_on=self.retry_on,
            handle_signals=handle_signals,
            stopping=self.stopping,
        )
        if prepare is not None:
            shell.on_startup.append(StartupHook(name="schema and topics", run=prepare))
        self.wire(shell)
        return shell

    async def run(self, prepare: Callable[[], Awaitable[object]] | None = None) -> int:
        """Start (retried while what it needs is away), consume until stopped, close; the
        exit code (signals are the caller's: see ``shell``)."""
        return await self.shell(prepare).run(self.consume)
