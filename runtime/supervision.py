"""Side tasks a service runs next to its consumer loop (view followers, keep-alives), watched.

A side task is meant to run as long as its service. One that raises, or returns while the
service is not stopping, has died; its service must not go on serving without it (e.g. on a
policy view that no longer follows the topic). Declared per task:

- not restartable (the default): the supervisor logs why and calls ``on_death`` once (the
  service stops as on SIGTERM: it finishes its batch, then exits non-zero with the reason,
  :attr:`Supervisor.failure`), and a process manager restarts the whole service;
- restartable: the task is started again after the runtime's backoff
  (:func:`runtime.retry.backoff`), each death logged.

:meth:`Supervisor.close` cancels the tasks in the reverse order of their start (a later task
may use an earlier one's view) and waits for each to end.

The shape is procrastinate's worker (``_start_side_tasks`` / ``_monitor_side_tasks``) and
Temporal's worker shutdown: side tasks are started with the service, watched while it runs,
and cancelled, last first, when it stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runtime.retry import Stopped, backoff, pause

log = logging.getLogger("ratifier.runtime")


@dataclass(frozen=True, kw_only=True)
class SideTask:
    """``run`` is called anew for each (re)start; it should run until cancelled."""

    name: str
    run: Callable[[], Awaitable[object]]
    restartable: bool = False


class Supervisor:
    """Runs side tasks for one service. ``stopping``: the service's stop event (a task that
    ends once it is set has not died); ``on_death``: how the service is asked to stop."""

    def __init__(
        self,
        *,
        service: str,
        stopping: asyncio.Event,
        on_death: Callable[[], object],
        backoff_of: Callable[[int], float] = backoff,
    ) -> None:
        self._service = service
        self._stopping = stopping
        self._on_death = on_death
        self._backoff = backoff_of
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        # Why the service had to stop (the first side task that died), else None.
        self.failure: str | None = None
        self.restarts: dict[str, int] = {}

    def start(self, side: SideTask) -> None:
        self._tasks.append(asyncio.create_task(self._supervise(side), name=side.name))

    def _ending(self) -> bool:
        return self._closing or self._stopping.is_set()

    async def _supervise(self, side: SideTask) -> None:
        attempt = 0
        while True:
            try:
                await side.run()
                why = "returned"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._ending():
                    return
                why = f"raised {type(exc).__name__}: {exc}"
                log.error("%s: side task %s %s", self._service, side.name, why, exc_info=exc)
            if self._ending():
                return
            if not side.restartable:
                self._died(f"side task {side.name} {why}")
                return
            delay = self._backoff(attempt)
            attempt += 1
            self.restarts[side.name] = attempt
            log.warning(
                "%s: side task %s %s; restart %d in %.1fs",
                self._service,
                side.name,
                why,
                attempt,
                delay,
            )
            try:
                await pause(delay, self._stopping)
            except Stopped:
                return

    def _died(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.error("%s stopping: %s", self._service, reason)
            self._on_death()

    async def close(self) -> None:
        """Cancel the side tasks, last started first, each awaited before the next."""
        self._closing = True
        while self._tasks:
            task = self._tasks.pop()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():  # close() itself cancelled
                    raise
            except Exception:
                log.exception("%s: side task %s failed while closing", self._service, task)
