"""The approval-join's lag and readiness read faust's delivered positions, never aiokafka's
`position` (which, in aiokafka 0.14.0 under faust-streaming 0.15.3, waits until a partition
without a position has one: minutes after a network cut, with the readiness timer waiting)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from faust.types import TP

from runtime.health import Health
from streams.app import DeliveredPositions

DELIVERED, UNTOUCHED, SOUGHT = (
    TP("t.calls.authorized", 0),
    TP("t.calls.authorized", 1),
    TP("t.approvals.decided", 0),
)


class JoinConsumer:
    """faust's consumer as the join's timer finds it after a cut: one partition whose
    position aiokafka would wait for forever."""

    def __init__(self) -> None:
        self._read_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)
        self._read_offset[DELIVERED] = 41  # records up to 41 delivered to the join
        self._read_offset[SOUGHT] = 7  # sought to its committed offset 7, nothing read since
        self.highwaters = {DELIVERED: 50, UNTOUCHED: 9, SOUGHT: 7}

    def assignment(self) -> set[TP]:
        return {DELIVERED, UNTOUCHED, SOUGHT}

    def highwater(self, tp: TP) -> int:
        return self.highwaters[tp]

    async def position(self, tp: TP) -> int:
        await asyncio.Event().wait()  # no position until the metadata is fresh again
        raise AssertionError("unreachable")


async def test_positions_are_what_the_join_was_delivered_without_waiting() -> None:
    delivered = DeliveredPositions(JoinConsumer())
    positions: dict[TP, Any] = {}
    async with asyncio.timeout(5):  # a bound for a broken test, not a timing assumption
        for tp in sorted(delivered.assignment()):
            positions[tp] = await delivered.position(tp)
    # The one after the last delivered record; unknown before any; never past the high
    # watermark (faust's read offset right after a seek is the next record's).
    assert positions == {DELIVERED: 42, UNTOUCHED: None, SOUGHT: 7}


async def test_readiness_is_observed_while_a_partition_has_no_position() -> None:
    health = Health("approval-join")
    health.running()
    health.polled()
    async with asyncio.timeout(5):
        await health.observe(DeliveredPositions(JoinConsumer()))
    # The lag of a partition nothing was delivered from is unknown, not waited for.
    assert (health.partitions, health.lag) == (3, None)
    ready, body = health.readiness()
    assert ready, body
