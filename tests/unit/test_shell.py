"""The service shell (runtime/shell.py): start-up hooks waited out while a service is down,
with /readyz not ready meanwhile; a dead side task stops the process; close in reverse order."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, cast

import pytest
from aiohttp import ClientSession

from runtime.health import Health
from runtime.shell import ServiceShell, StartupHook, run_until
from runtime.startup import open_pool
from runtime.supervision import SideTask

pytestmark = pytest.mark.timeout(20)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def shell(**change: object) -> ServiceShell:
    options: dict[str, object] = {
        "service": "test",
        "health": Health("test"),
        "handle_signals": False,
        "backoff_of": lambda _attempt: 0.01,
        "grace_seconds": 1.0,
    }
    options.update(change)
    return ServiceShell(**options)  # type: ignore[arg-type]


async def test_a_hook_failing_while_its_service_is_down_is_retried_and_readyz_says_not_ready() -> (
    None
):
    port = free_port()
    service = shell(http_port=port)
    database_up = asyncio.Event()
    attempts = 0
    retried = asyncio.Event()
    seen: list[tuple[int, dict[str, object]]] = []

    async def connect() -> None:
        nonlocal attempts
        attempts += 1
        if attempts >= 3:
            retried.set()
        if not database_up.is_set():
            raise OSError("connection refused")

    service.on_startup.append(StartupHook(name="PostgreSQL", run=connect))
    ran = asyncio.Event()

    async def main(stop: asyncio.Event) -> None:
        ran.set()
        await stop.wait()

    running = asyncio.create_task(service.run(main))
    async with ClientSession() as http:
        await asyncio.wait_for(retried.wait(), 5)  # the hook is being retried
        async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
            seen.append((response.status, json.loads(await response.text())))
        assert not ran.is_set()
        database_up.set()
        await asyncio.wait_for(ran.wait(), 5)
    service.shutdown()
    assert await running == 0
    status, body = seen[0]
    assert status == 503
    assert "PostgreSQL: connection refused" in str(body["why"])


async def test_a_hook_that_refuses_is_not_retried() -> None:
    service = shell()
    attempts = 0

    async def refuse() -> None:
        nonlocal attempts
        attempts += 1
        raise ValueError("schema behind the build")

    service.on_startup.append(StartupHook(name="schema", run=refuse))

    async def main(_stop: asyncio.Event) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match="schema behind"):
        await service.run(main)
    assert attempts == 1


async def test_a_stop_while_waiting_for_a_service_ends_the_start() -> None:
    service = shell()

    async def down() -> None:
        service.shutdown()
        raise OSError("down")

    service.on_startup.append(StartupHook(name="Kafka", run=down))

    async def main(_stop: asyncio.Event) -> None:
        raise AssertionError("must not run")

    assert await service.run(main) == 0


async def test_a_dead_side_task_stops_the_process_with_an_error() -> None:
    service = shell()

    async def follower() -> None:
        raise RuntimeError("view lost")

    service.side_tasks.append(SideTask(name="policy feed", run=follower))
    main_stopped = asyncio.Event()

    async def main(stop: asyncio.Event) -> None:
        await stop.wait()
        main_stopped.set()

    assert await service.run(main) == 1
    assert main_stopped.is_set()
    assert service.failure is not None
    assert "policy feed" in service.failure


async def test_close_runs_side_tasks_then_closers_last_registered_first() -> None:
    service = shell()
    order: list[str] = []

    async def side() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("side task cancelled")

    service.side_tasks.append(SideTask(name="side", run=side))

    def closer(name: str) -> object:
        async def close() -> None:
            order.append(name)

        return close

    service.on_shutdown.extend([closer("database"), closer("producer")])  # type: ignore[list-item]

    async def main(stop: asyncio.Event) -> None:
        await asyncio.sleep(0.05)
        service.shutdown()
        await stop.wait()
        order.append("main finished")

    assert await service.run(main) == 0
    assert order == ["main finished", "side task cancelled", "producer", "database"]


async def test_main_busy_past_the_grace_period_is_cancelled() -> None:
    service = shell(grace_seconds=0.05)
    cancelled = asyncio.Event()

    async def main(_stop: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()  # ignores the stop
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.05, service.shutdown)
    assert await service.run(main) == 0
    assert cancelled.is_set()


class StubLoop:
    """A consumer loop that runs until asked to stop."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    def stop(self) -> None:
        self.stopped.set()

    async def run(self) -> None:
        await self.stopped.wait()


async def test_run_until_stops_the_loop_when_the_shell_stops() -> None:
    loop, stop = StubLoop(), asyncio.Event()
    running = asyncio.create_task(run_until(loop, stop))
    await asyncio.sleep(0)
    assert not running.done()
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    assert loop.stopped.is_set()


class RefusingPool:
    """A pool whose first connections never come (PostgreSQL away)."""

    def __init__(self) -> None:
        self.closed = False

    async def open(self, *, wait: bool, timeout: float) -> None:
        raise TimeoutError("pool initialization incomplete")

    async def close(self, timeout: float = 5.0) -> None:
        self.closed = True


async def test_a_pool_that_does_not_open_is_closed_for_the_next_try() -> None:
    pool = RefusingPool()
    with pytest.raises(TimeoutError):
        await open_pool(cast(Any, pool), wait_seconds=0.1)
    assert pool.closed  # else it keeps reconnecting on its own beside the retry's new pool
