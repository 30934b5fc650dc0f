"""Liveness and readiness from what a service's loop reports (runtime/health.py): a fake clock
and a fake consumer, no I/O."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from runtime.health import Health


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeConsumer:
    highwaters: dict[TopicPartition, int | None] = field(default_factory=dict)
    positions: dict[TopicPartition, int] = field(default_factory=dict)

    def assignment(self) -> set[TopicPartition]:
        return set(self.highwaters)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters[tp]

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]


def health(clock: Clock) -> Health:
    return Health("executor", stale_seconds=60, poll_seconds=30, max_lag=100, clock=clock)


def test_a_starting_service_is_alive_and_not_ready() -> None:
    h = health(Clock())
    assert h.liveness()[0]
    ready, body = h.readiness()
    assert not ready and body["why"] == "starting"
    h.waiting_for("kafka: Unable to bootstrap from [('127.0.0.1', 1)]")
    ready, body = h.readiness()
    assert not ready and body["why"].startswith("kafka: Unable to bootstrap")
    assert h.liveness()[1]["phase"] == "starting"


def test_ready_when_polling_assigned_and_caught_up() -> None:
    clock = Clock()
    h = health(clock)
    h.running()
    h.polled()
    assert h.readiness()[1]["why"] == "no partitions assigned"
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = FakeConsumer({p0: 50, p1: 80}, {p0: 40, p1: 30})
    asyncio.run(h.observe(consumer))
    assert (h.partitions, h.lag) == (2, 60)
    ready, body = h.readiness()
    assert ready and body["why"] is None and body["lag"] == 60
    consumer.positions[p1] = 0  # a backlog above the bound
    asyncio.run(h.observe(consumer))
    ready, body = h.readiness()
    assert (not ready and body["why"] == "lag 90 above 100") or body["lag"] == 90
    consumer.highwaters[p0] = 500
    asyncio.run(h.observe(consumer))
    ready, body = h.readiness()
    assert not ready and body["why"] == "lag 540 above 100"


def test_lag_unknown_until_fetched_does_not_block_readiness() -> None:
    h = health(Clock())
    h.running()
    h.polled()
    asyncio.run(h.observe(FakeConsumer({TopicPartition("t", 0): None}, {})))
    assert (h.partitions, h.lag) == (1, None)
    assert h.readiness()[0]


def test_a_loop_that_stopped_turning_is_not_alive_and_not_ready() -> None:
    clock = Clock()
    h = health(clock)
    h.running()
    h.polled()
    asyncio.run(h.observe(FakeConsumer({TopicPartition("t", 0): 1}, {TopicPartition("t", 0): 1})))
    assert h.liveness()[0] and h.readiness()[0]
    clock.now += 31
    ready, body = h.readiness()
    assert not ready and body["why"] == "no poll within 30s"
    assert h.liveness()[0]
    clock.now += 30
    alive, body = h.liveness()
    assert not alive and body["last_loop_s"] == 61
    h.polled()
    assert h.liveness()[0] and h.readiness()[0]


def test_a_consumer_not_started_has_no_assignment() -> None:
    class NotStarted:
        def assignment(self) -> set[TopicPartition]:
            raise RuntimeError("not started")

    h = health(Clock())
    h.partitions = 3
    asyncio.run(h.observe(NotStarted()))
    assert (h.partitions, h.lag) == (0, None)
