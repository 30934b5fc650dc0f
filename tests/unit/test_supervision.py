"""runtime/supervision.py with fake side tasks: a dead side task stops its service, or is
restarted with the backoff when it is restartable; close cancels them last first."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from runtime.supervision import SideTask, Supervisor


@dataclass
class Service:
    """The fake service: its stop event, and how often it was asked to stop."""

    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    stops: int = 0

    def stop(self) -> None:
        self.stops += 1
        self.stopping.set()

    def supervisor(self) -> Supervisor:
        return Supervisor(
            service="fake", stopping=self.stopping, on_death=self.stop, backoff_of=lambda _: 0.01
        )


async def _forever(log: list[str], name: str) -> None:
    log.append(f"{name} started")
    try:
        await asyncio.Event().wait()
    finally:
        log.append(f"{name} cancelled")


async def _within(condition: asyncio.Event, seconds: float = 5.0) -> None:
    await asyncio.wait_for(condition.wait(), timeout=seconds)


async def test_a_side_task_that_raises_stops_the_service_with_its_reason() -> None:
    service = Service()
    supervisor = service.supervisor()
    log: list[str] = []

    async def follower() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("broker gone")

    supervisor.start(SideTask(name="other", run=lambda: _forever(log, "other")))
    supervisor.start(SideTask(name="policy follower", run=follower))
    await _within(service.stopping)
    assert supervisor.failure == "side task policy follower raised ConnectionError: broker gone"
    await supervisor.close()
    assert service.stops == 1
    assert log == ["other started", "other cancelled"]


async def test_a_side_task_that_returns_while_the_service_runs_has_died_too() -> None:
    service = Service()
    supervisor = service.supervisor()

    async def quits() -> None:
        await asyncio.sleep(0)

    supervisor.start(SideTask(name="keep-alive", run=quits))
    await _within(service.stopping)
    await supervisor.close()
    assert supervisor.failure == "side task keep-alive returned"


async def test_a_restartable_side_task_is_started_again_and_the_service_goes_on() -> None:
    service = Service()
    supervisor = service.supervisor()
    runs: list[int] = []
    third = asyncio.Event()

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise ConnectionError("redis away")
        third.set()
        await asyncio.Event().wait()

    supervisor.start(SideTask(name="keep-alive", run=flaky, restartable=True))
    await _within(third)
    assert not service.stopping.is_set()
    assert supervisor.failure is None
    assert supervisor.restarts == {"keep-alive": 2}
    await supervisor.close()
    assert runs == [0, 1, 2]


async def test_ends_during_a_requested_stop_are_no_deaths_and_close_goes_last_first() -> None:
    service = Service()
    supervisor = service.supervisor()
    log: list[str] = []

    async def until_stopped() -> None:
        await service.stopping.wait()

    supervisor.start(SideTask(name="first", run=lambda: _forever(log, "first")))
    supervisor.start(SideTask(name="second", run=lambda: _forever(log, "second")))
    supervisor.start(SideTask(name="returns on stop", run=until_stopped))
    await asyncio.sleep(0.05)
    service.stop()
    await supervisor.close()
    assert supervisor.failure is None
    assert service.stops == 1
    assert log == ["first started", "second started", "second cancelled", "first cancelled"]


async def test_a_restartable_task_waiting_for_its_restart_ends_on_stop() -> None:
    service = Service()
    supervisor = Supervisor(
        service="fake", stopping=service.stopping, on_death=service.stop, backoff_of=lambda _: 60
    )
    died = asyncio.Event()

    async def dies() -> None:
        died.set()
        raise ConnectionError("away")

    supervisor.start(SideTask(name="keep-alive", run=dies, restartable=True))
    await _within(died)
    await asyncio.sleep(0)
    service.stop()
    await asyncio.wait_for(supervisor.close(), timeout=5)
    assert supervisor.failure is None


@pytest.mark.parametrize("restartable", [False, True])
async def test_only_the_first_death_is_the_reason(restartable: bool) -> None:
    service = Service()
    supervisor = service.supervisor()

    async def dies() -> None:
        raise ValueError("bug")

    supervisor.start(SideTask(name="a", run=dies))
    supervisor.start(SideTask(name="b", run=dies, restartable=restartable))
    await _within(service.stopping)
    await supervisor.close()
    assert supervisor.failure == "side task a raised ValueError: bug"
    assert service.stops == 1
