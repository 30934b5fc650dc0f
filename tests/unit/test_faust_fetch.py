"""Hole 5 of streams/faust_patches.py (faust-streaming 0.15.3 over aiokafka 0.14.0): the
consumer thread gets a copy of the active partitions, never the live set (empty means "every
partition" to aiokafka), and records fetched but not delivered are fetched again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from types import SimpleNamespace
from typing import Any, cast

from aiokafka.consumer.fetcher import Fetcher, FetchResult
from faust.types import TP

from streams import faust_patches
from streams.faust_patches import _getmany_in_order, _wait_next_records_snapshot

# faust's own methods, as they were before any correction was installed in this process.
ORIGINAL_WAIT_NEXT_RECORDS = faust_patches._original_wait_next_records
ORIGINAL_GETMANY = faust_patches._original_getmany

DECIDED, CHANGELOG = TP("t.approvals.decided", 1), TP("t-approvals-changelog", 1)


class PartitionRecords:
    """What aiokafka's FetchResult iterates: records of one partition, in offset order."""

    def __init__(self, offsets: Iterable[int]) -> None:
        self.records = [SimpleNamespace(offset=o) for o in offsets]
        self.next_fetch_offset = self.records[0].offset

    def __iter__(self) -> PartitionRecords:
        return self

    def __next__(self) -> Any:
        if not self.records:
            raise StopIteration
        record = self.records.pop(0)
        self.next_fetch_offset = record.offset + 1
        return record


def fetched(tp: TP, offsets: Iterable[int]) -> FetchResult:
    state = SimpleNamespace(paused=False, position=min(offsets), consumed_to=lambda _o: None)
    assignment = SimpleNamespace(active=True, state_value=lambda _tp: state)
    return FetchResult(
        tp, assignment=assignment, partition_records=PartitionRecords(offsets), backoff=0
    )


async def test_aiokafka_0_14_0_returns_every_partition_for_an_empty_set() -> None:
    """Why the live set is dangerous: emptied while the thread waits, it asks for everything."""
    fetcher: Any = SimpleNamespace(
        _subscriptions=SimpleNamespace(
            reassignment_in_progress=False, is_assigned=lambda _tp: True
        ),
        _wait_consume_future=None,
        _records={DECIDED: fetched(DECIDED, [7, 8])},
        _notify=lambda _future: None,
    )
    assert await Fetcher.fetched_records(fetcher, {CHANGELOG}) == {}
    drained = await Fetcher.fetched_records(fetcher, set())
    assert [r.offset for r in drained[DECIDED]] == [7, 8]


class FetchingConsumer:
    """The parts of faust's Consumer that `_wait_next_records` and `getmany` use."""

    def __init__(self, records: dict[TP, list[Any]], active: set[TP]) -> None:
        self.records = records
        self._active_partitions = active
        self._buffered_partitions: set[TP] = set()
        self._read_offset: dict[TP, int | None] = {}
        self.flow_active = True
        self.should_stop = False
        self.not_waiting_next_records = asyncio.Event()
        self.handed: list[set[TP]] = []
        self.emptied_while_fetching = False
        self.sought: list[tuple[TP, int]] = []
        self.app = SimpleNamespace(
            client_only=False,
            consumer_generation_id=4,
            topics=SimpleNamespace(acks_enabled_for=lambda topic: "changelog" not in topic),
            monitor=SimpleNamespace(track_tp_end_offset=lambda _tp, _hw: None),
        )
        self.scheduler = SimpleNamespace(
            iterate=lambda records: ((tp, r) for tp, rs in records.items() for r in rs)
        )
        self._thread = SimpleNamespace(call_thread=self._call_thread, seek=self._seek)

    def _get_active_partitions(self) -> set[TP]:
        return self._active_partitions

    async def _getmany(self, active_partitions: set[TP], timeout: float) -> dict[TP, list[Any]]:
        self.handed.append(active_partitions)
        if self.emptied_while_fetching:
            self._active_partitions.clear()  # the event loop pauses partitions meanwhile
        return {tp: rs for tp, rs in self.records.items() if tp in active_partitions}

    async def _wait_next_records(self, timeout: float) -> tuple[Any, set[TP] | None]:
        return await _wait_next_records_snapshot(self, timeout)

    async def sleep(self, _seconds: float) -> None:
        return None

    async def wait(self, *_args: Any) -> None:
        return None

    def assignment(self) -> set[TP]:
        return {DECIDED, CHANGELOG}

    def highwater(self, _tp: TP) -> int:
        return 100

    def _to_message(self, tp: TP, record: Any) -> Any:
        return SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=record.offset)

    async def _call_thread(self, fun: Any, *args: Any) -> Any:
        return fun(*args)

    def _seek(self, tp: TP, offset: int) -> None:
        self.sought.append((tp, offset))


def records(*offsets: int) -> list[Any]:
    return [SimpleNamespace(offset=o) for o in offsets]


async def test_faust_0_15_3_hands_the_consumer_thread_its_live_set() -> None:
    consumer = FetchingConsumer({DECIDED: records(7)}, {CHANGELOG})
    await ORIGINAL_WAIT_NEXT_RECORDS(cast(Any, consumer), 1.0)
    assert consumer.handed[0] is consumer._active_partitions


async def test_the_consumer_thread_gets_a_copy_and_nothing_is_fetched_for_an_empty_set() -> None:
    consumer = FetchingConsumer({DECIDED: records(7)}, {CHANGELOG})
    consumer.emptied_while_fetching = True
    found, _ = await _wait_next_records_snapshot(consumer, 1.0)
    assert consumer.handed == [{CHANGELOG}]
    assert consumer.handed[0] is not consumer._active_partitions
    assert found == {}  # the copy still said "the changelog only", not "everything"
    consumer.handed.clear()
    assert await _wait_next_records_snapshot(consumer, 1.0) == ({}, set())
    assert consumer.handed == []


async def delivered(getmany: Any, consumer: FetchingConsumer, *, stop_after: int) -> list[int]:
    """Offsets ``getmany`` yields; the flow stops (a rebalance begins) after ``stop_after``."""
    offsets: list[int] = []
    stream: AsyncIterator[tuple[TP, Any]] = getmany(consumer, 1.0)
    async for _tp, message in stream:
        offsets.append(message.offset)
        if len(offsets) == stop_after:
            consumer.flow_active = False
    return offsets


async def test_faust_0_15_3_drops_the_rest_of_a_fetch_when_the_flow_stops() -> None:
    consumer = FetchingConsumer({DECIDED: records(7, 8, 9)}, {DECIDED})
    assert await delivered(ORIGINAL_GETMANY, consumer, stop_after=1) == [7]
    assert consumer.sought == []  # 8 and 9: fetched, past aiokafka's position, never again


async def test_records_not_delivered_are_fetched_again() -> None:
    consumer = FetchingConsumer({DECIDED: records(7, 8, 9)}, {DECIDED})
    assert await delivered(_getmany_in_order, consumer, stop_after=1) == [7]
    assert consumer.sought == [(DECIDED, 8)]


async def test_records_of_a_partition_paused_meanwhile_are_fetched_again() -> None:
    consumer = FetchingConsumer(
        {DECIDED: records(7, 8), CHANGELOG: records(3)}, {DECIDED, CHANGELOG}
    )
    consumer.emptied_while_fetching = True  # both paused after the thread answered
    assert await delivered(_getmany_in_order, consumer, stop_after=99) == []
    # The stream partition is fetched again; the changelog is recovery's concern.
    assert consumer.sought == [(DECIDED, 7)]
