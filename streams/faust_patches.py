"""Every correction this project makes to faust-streaming (and to the aiokafka it drives), in
one place. faust hosts only the approval-join (streams/approval_join.py); these corrections keep
its delivery around a rebalance from skipping a record or stopping a partition's commits.

Holes 1-3 and 5 were found in faust-streaming **0.15.3**, hole 4 in aiokafka **0.14.0** (the
versions pinned in pyproject.toml); each fix copies or wraps that version's internals. Importing
this module asserts both installed versions, so an upgrade fails at once and forces every hole
below to be re-checked against the new code (tests/unit/test_faust_*.py test each hole).

1. **Rewind never-committed partitions, to an offset.** After every rebalance faust pauses
   the stream partitions, restores tables, then calls `seek_to_committed()` to rewind anything
   fetched meanwhile. aiokafka's implementation only seeks when the committed offset is > 0,
   so a partition this group never committed (or committed at 0) is not rewound: a record
   fetched during recovery and dropped with the buffers is lost. For such partitions the
   committed position is the beginning: we look its offset up and seek there, and report it
   as the committed offset, so that faust's read offset and `InOrderDelivery` (3.) expect
   exactly it. A pending "reset to earliest" (what `seek_to_beginning` does) left them
   expecting nothing: a record fetched before the seek, further on, was then taken as the
   partition's first and the true first records were dropped as already read; issue 26's
   reproduction lost offsets 0 and 1 of two `approvals.decided` partitions that way.

2. **Resume fetching only once the streams take records again.** faust's
   `Recovery.on_recovery_completed` (the path of every app with a table, so the join's after
   every rebalance) and `Recovery._resume_streams` (apps without tables) resume the stream
   partitions, *then* seek them to their committed offsets, and only after that resume the flow.
   Until issue 26 only `_resume_streams` was corrected, which the join never runs. A record
   fetched between the seek and the resumed flow is dropped (the flow is suspended) and never
   fetched again (the seek is behind it); if it sits exactly at the committed offset, the
   records after it are acked and faust commits past it (`Consumer._new_offset` accepts one
   missing offset at the committed position). The soak saw exactly that: one call authorized
   during a rebalance that kept its partition on the same worker, never committed, the join's
   offset past it. Here the seek comes first, then the flow, then the partitions: nothing is
   fetched while nothing is taken.

3. **Deliver each partition in offset order after a seek.** After a broker restart the
   broker-restart test saw, right after the seek to the committed offsets, a record from
   *before* the seek reach faust's drain loop (offset 59 of a partition just rewound to 26).
   faust takes any record ahead of its read position as proof that the offsets in between do
   not exist (compaction, transaction markers): it records them as a "gap", counts them as
   acknowledged, and drops the re-fetched records 26..58 as already read. That can skip
   records never processed, and the gap's offsets, appended to the acknowledged list a second
   time when the re-fetched copies are processed, make `Consumer._new_offset` advance the
   commit by one offset per commit interval: 125 records left uncommitted a minute later, then
   replayed by the next restart (issue 17). Our topics have neither compaction nor transactions
   (the changelogs, which do, are not acknowledged and are left alone), so a record ahead of the
   expected offset is stale: `InOrderDelivery` drops it and seeks the partition back. The
   seek back runs in faust's consumer thread (faust's own `Consumer.seek` calls aiokafka from
   the main thread, racing the fetcher that lives in the consumer thread), so the next fetch
   is after it. A record still ahead in a later fetch is a hole only if the broker says so (its
   log start offset is past the expected offset: deleted by retention); otherwise the partition
   is sought back again. Accepting such a hole on a guess, as this module did until CI lost an
   approval decision after a restart (issue 26), skips records that exist: lost, and faust's
   commit stuck before them. As a second guard, duplicate offsets in faust's acknowledged list
   are removed before each commit computes its offset.

4. **Ask the new leader for a reset offset, not the old one** (aiokafka **0.14.0**, the client
   faust drives, pinned with it). A partition without a position (just assigned and never
   committed, or reset) gets one from its leader (`Fetcher._update_fetch_positions`). When that
   request fails — the leader moved, or was cut off — aiokafka logs "Failed fetch offsets from
   N" and retries every 100 ms against the leader it had cached, without refreshing its
   metadata (its other offset lookups and its record fetches do refresh it), until the metadata
   ages out (`consumer_metadata_max_age_ms`, 5 minutes). Meanwhile the partition is not fetched,
   and whatever awaits its position waits with it: the join's lag timer (its readiness) sat
   163 s in this loop after `leader_isolated` in the first partitions run. Here a failed offset
   request whose error means stale metadata asks for a metadata refresh before it is retried.

5. **Fetch only what can be delivered, and fetch again what was not.** faust hands the consumer
   thread its *live* set of active partitions, which the event loop keeps changing while the
   thread waits up to a second for records; aiokafka reads an empty set as "every partition".
   faust then drops, without a word, each returned record of a partition that is not active
   when the record's turn comes, or that comes after the flow stopped or the generation
   changed, although aiokafka's position has already moved past it. When table recovery
   ended (the changelogs paused, the set empty for a moment), the decisions published while
   the join restarted were fetched and dropped that way: never processed, never committed,
   the approvals expired (CI, issue 26; a loop of restarts lost them in 2 of 14 restarts, and
   none in 30 after this correction). Here the thread gets a copy of the set, nothing is
   fetched while it is empty, and an acknowledged partition whose records were not delivered
   is sought back to the first of them.

All five can only cause redelivery, which every stage tolerates (idempotent by call id).
The second and fifth copy faust-streaming 0.15.3's methods, the first three rely on its internals
(`_read_offset`, `_acked`, `perform_seek`, `getmany`) and the fourth on aiokafka 0.14.0's
(`Fetcher._proc_offset_request`), which is why both versions are pinned exactly and checked
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

import aiokafka
import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.errors import IllegalStateError, KafkaError
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.types import TP

log = logging.getLogger("ratifier.streams")

# The versions every correction here was written against (see above).
FAUST_VERSION = "0.15.3"
AIOKAFKA_VERSION = "0.14.0"


def check_version(package: str, wanted: str, found: str) -> None:
    """Refuse any version of ``package`` but the one every hole here was checked against."""
    if found != wanted:
        raise ImportError(
            f"streams.faust_patches corrects {package} {wanted}, found {found}: "
            "re-check each hole against the new version, then update it"
        )


def check_faust_version(found: str) -> None:
    check_version("faust-streaming", FAUST_VERSION, found)


check_faust_version(faust.__version__)
check_version("aiokafka", AIOKAFKA_VERSION, aiokafka.__version__)

_original_seek = AIOKafkaConsumer.seek_to_committed
_original_on_recovery_completed = Recovery.on_recovery_completed
_installed = False


async def _seek_to_committed_or_beginning(self: Any, *partitions: Any) -> Any:
    committed = await _original_seek(self, *partitions)
    never = [tp for tp, offset in committed.items() if not offset]
    if never:
        # The beginning as an offset, not a pending reset: faust's read offset and
        # `InOrderDelivery` then expect exactly it, so a record fetched before this seek
        # (further on) is sought back instead of being taken as the partition's first and
        # the true first records dropped as already read (the lost decision, issue 26).
        beginnings = await self.beginning_offsets(never)
        for tp in never:
            self.seek(tp, beginnings[tp])
            committed[tp] = beginnings[tp]
        log.debug("rewound %d never-committed partitions to their beginning", len(never))
    return committed


async def _resume_streams_in_order(self: Any, generation_id: int = 0) -> None:
    """faust 0.15's `Recovery._resume_streams` with its steps reordered (see 2. above)."""
    app = self.app
    consumer = app.consumer
    await app.on_rebalance_complete.send()
    assignment = consumer.assignment()
    if app.consumer_generation_id != generation_id:
        self.log.warning("Recovery rebalancing again")
        return
    streams = {tp for tp in assignment if not self._is_changelog_tp(tp)}
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=app.conf.broker_request_timeout)
    else:
        self.log.info("Resuming streams with empty assignment")
    self.completed.set()
    self.log.info("Resuming flow...")
    app.flow_control.resume()
    consumer.resume_flow()
    if streams:
        consumer.resume_partitions(streams)
    await cast(Any, app)._fetcher.maybe_start()
    self.tables.on_actives_ready()
    self.tables.on_standbys_ready()
    app.on_rebalance_end()
    self.log.info("Worker ready")


async def _on_recovery_completed_in_order(self: Any, generation_id: int = 0) -> None:
    """faust 0.15.3's `Recovery.on_recovery_completed` with its steps reordered (see 2.)."""
    consumer = self.app.consumer
    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    callback_coros = [
        asyncio.ensure_future(
            table.on_recovery_completed(
                self.actives_for_table[table], self.standbys_for_table[table]
            )
        )
        for table in self.tables.values()
    ]
    if callback_coros:
        await asyncio.wait(callback_coros)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning(
            f"Recovery rebalancing again app id {self.app.consumer_generation_id} "
            f"param {generation_id}"
        )
        return
    streams = {tp for tp in assignment if not self._is_changelog_tp(tp)}
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
    self.completed.set()
    self.app.flow_control.resume()
    consumer.resume_flow()
    if streams:
        consumer.resume_partitions(streams)
    await cast(Any, self.app)._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")


class Admission(Enum):
    """What to do with a fetched record (see 3. above)."""

    DELIVER = "deliver"
    DROP = "drop"  # already delivered since the last seek, or stale and already re-sought
    RESEEK = "reseek"  # stale: drop it and seek the partition back to the expected offset
    VERIFY = "verify"  # still ahead after a seek back: ask the broker whether it is a hole


@dataclass
class InOrderDelivery:
    """The offset each acknowledged partition must deliver next, and the fetch in which a
    partition was last sought back. Pure bookkeeping: the caller does the seeking.

    ``expected[tp]`` is None (anything is accepted) until a seek says where the partition is.
    A fetch is one call of faust's `getmany`; records of a later fetch than the one that sought
    back were fetched after that seek, so one of them still ahead of the expected offset marks a
    real hole, never a stale record."""

    expected: dict[TP, int | None] = field(default_factory=dict)
    sought_in: dict[TP, int] = field(default_factory=dict)
    fetch: int = 0

    def sought(self, tp: TP, offset: int | None) -> None:
        self.expected[tp] = offset if offset is not None and offset >= 0 else None

    def revoked(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            self.expected.pop(tp, None)
            self.sought_in.pop(tp, None)

    def next_fetch(self) -> None:
        self.fetch += 1

    def admit(self, tp: TP, offset: int) -> Admission:
        want = self.expected.get(tp)
        if want is None or offset == want:
            return self._deliver(tp, offset)
        if offset < want:
            return Admission.DROP
        sought_in = self.sought_in.get(tp)
        if sought_in is None:
            self.sought_in[tp] = self.fetch
            return Admission.RESEEK
        if sought_in != self.fetch:
            # The caller asks the broker, then calls `hole` or `reseek`; until then the rest
            # of this fetch is dropped like any stale record.
            self.sought_in[tp] = self.fetch
            return Admission.VERIFY
        return Admission.DROP

    def hole(self, tp: TP, offset: int, *, log_start: int) -> Admission:
        """The broker's answer to VERIFY: the offsets before ``offset`` are gone only if its
        log starts past the expected one; otherwise the record is stale again."""
        want = self.expected.get(tp)
        if want is None or log_start > want:
            log.warning(
                "%s[%d]: offsets %s..%d no longer exist (log starts at %d); continuing at %d",
                tp.topic,
                tp.partition,
                want,
                offset - 1,
                log_start,
                offset,
            )
            return self._deliver(tp, offset)
        return Admission.RESEEK

    def _deliver(self, tp: TP, offset: int) -> Admission:
        self.expected[tp] = offset + 1
        self.sought_in.pop(tp, None)
        return Admission.DELIVER


_original_getmany = Consumer.getmany
_original_wait_next_records = Consumer._wait_next_records
_original_perform_seek = Consumer.perform_seek
_original_consumer_seek = Consumer.seek
_original_revoked = Consumer.on_partitions_revoked
_original_new_offset = Consumer._new_offset


def _delivery_of(consumer: Any) -> InOrderDelivery:
    delivery: InOrderDelivery | None = consumer.__dict__.get("_ratifier_in_order")
    if delivery is None:
        delivery = consumer.__dict__["_ratifier_in_order"] = InOrderDelivery()
    return delivery


async def _wait_next_records_snapshot(
    self: Any,
    timeout: float,  # noqa: ASYNC109 - faust's signature
) -> tuple[Any, set[TP] | None]:
    """faust 0.15.3's `Consumer._wait_next_records`, handing the consumer thread a copy of the
    active partitions (see 5. above): never the live set, which an empty value turns into
    "every partition" on the other side."""
    if not self.flow_active:
        await self.wait(self.can_resume_flow)
    try:
        self.not_waiting_next_records.set()
        active = set(self._get_active_partitions())
        if not active:
            await self.sleep(1)  # faust's: still release the event loop
            return {}, active
        records = await self._getmany(active_partitions=active, timeout=timeout)
        return records, active
    finally:
        self.not_waiting_next_records.set()


async def _getmany_in_order(
    self: Any,
    timeout: float,  # noqa: ASYNC109 - faust's signature
) -> AsyncIterator[tuple[TP, Any]]:
    """faust 0.15.3's `Consumer.getmany` with two corrections: each acknowledged partition is
    delivered in offset order (3. above), and a record fetched but not delivered because the
    flow stopped or the generation changed meanwhile sends its partition back to it (5.)."""
    delivery = _delivery_of(self)
    delivery.next_fetch()
    records, _active = await self._wait_next_records(timeout)
    generation_id = self.app.consumer_generation_id
    if records is None or self.should_stop:
        return
    if not self.flow_active:
        # faust's: a fetch that returns while the flow is stopped seeks back to committed.
        try:
            await self.perform_seek()
        except Exception as error:  # noqa: BLE001 - faust's: logged, the next fetch retries
            log.warning("exception performing seek when flow not active %s", error)
        return
    acks_enabled_for = self.app.topics.acks_enabled_for
    undelivered: dict[TP, int] = {}
    for tp, record in self.scheduler.iterate(records):
        # faust's conditions, read as it reads them, per record: the partitions' live state.
        if (
            tp in undelivered
            or not self.flow_active
            or self.app.consumer_generation_id != generation_id
            or not (tp in self._get_active_partitions() or tp in self._buffered_partitions)
        ):
            # faust drops these, its fetch position already past them. A changelog's records
            # are recovery's concern (it stopped reading them, or starts again); an acknowledged
            # partition's are fetched again.
            if acks_enabled_for(tp.topic):
                undelivered.setdefault(tp, record.offset)
            continue
        self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
        message = self._to_message(tp, record)
        if not acks_enabled_for(message.topic):
            yield tp, message  # a changelog: compacted, its holes are real; faust's concern
            continue
        admission = delivery.admit(tp, message.offset)
        if admission is Admission.VERIFY:
            log_start = (await self.earliest_offsets(tp))[tp]
            admission = delivery.hole(tp, message.offset, log_start=log_start)
        if admission is Admission.DELIVER:
            yield tp, message
        elif admission is Admission.RESEEK:
            want = cast(int, delivery.expected[tp])
            log.warning(
                "%s[%d]: record %d fetched before the last seek, expected %s; seeking back",
                tp.topic,
                tp.partition,
                message.offset,
                want,
            )
            await _seek_in_consumer_thread(self, tp, want)
    for tp, offset in undelivered.items():
        await _return_undelivered(self, tp, offset)


async def _return_undelivered(consumer: Any, tp: TP, offset: int) -> None:
    """Fetch ``tp`` again from ``offset``, its first record fetched and not delivered (5.)."""
    if tp not in consumer.assignment():
        return  # revoked: its next owner starts at the committed offset
    log.info(
        "%s[%d]: records from %d fetched but not delivered (rebalance); fetching them again",
        tp.topic,
        tp.partition,
        offset,
    )
    with contextlib.suppress(IllegalStateError):  # revoked meanwhile: as above
        await _seek_in_consumer_thread(consumer, tp, offset)


async def _seek_in_consumer_thread(consumer: Any, tp: TP, offset: int) -> None:
    """faust's `Consumer.seek`, but run in the consumer thread, after whatever that thread is
    doing with the partition's fetches (see 3. above)."""
    thread = consumer._thread
    await thread.call_thread(thread.seek, tp, offset)
    consumer._read_offset[tp] = offset if offset else None


async def _perform_seek_tracked(self: Any) -> None:
    await _original_perform_seek(self)
    # perform_seek sought every assigned partition and left each one's committed offset (or
    # None: never committed, rewound to its beginning, whose offset is not known here) as
    # faust's read offset.
    delivery = _delivery_of(self)
    positions = []
    for tp in self.assignment():
        delivery.sought(tp, self._read_offset.get(tp))
        positions.append(f"{tp.topic}[{tp.partition}]@{self._read_offset.get(tp)}")
    # Where each partition starts after a rebalance (None: never committed, its beginning):
    # what a lost record's investigation needs first.
    log.info("stream partitions sought to: %s", ", ".join(sorted(positions)))


async def _seek_tracked(self: Any, partition: TP, offset: int) -> None:
    await _original_consumer_seek(self, partition, offset)
    _delivery_of(self).sought(partition, offset)


async def _revoked_tracked(self: Any, revoked: set[TP]) -> None:
    _delivery_of(self).revoked(revoked)
    await _original_revoked(self, revoked)


def _new_offset_without_duplicates(self: Any, tp: TP) -> int | None:
    acked = self._acked[tp]
    if len(acked) != len(set(acked)):
        acked[:] = sorted(set(acked))
    result: int | None = _original_new_offset(self, tp)
    return result


_original_proc_offset_request = Fetcher._proc_offset_request


async def _offset_request_refreshing_metadata(
    self: Any, node_id: int, topic_data: Any
) -> dict[Any, Any]:
    """aiokafka 0.14.0's `Fetcher._proc_offset_request`, asking for fresh metadata when it
    fails because of stale metadata (see 4. above)."""
    try:
        offsets: dict[Any, Any] = await _original_proc_offset_request(self, node_id, topic_data)
    except KafkaError as error:
        if error.invalid_metadata:
            # Not awaited: the client refreshes in the background, as aiokafka's own fetch
            # path does; the caller's retry 100 ms later then goes to the current leader.
            self._client.force_metadata_update()
        raise
    return offsets


def install_faust_patches() -> None:
    """Install the corrections in this process (idempotent)."""
    global _installed  # noqa: PLW0603 - one process-wide patch
    if not _installed:
        AIOKafkaConsumer.seek_to_committed = _seek_to_committed_or_beginning
        Recovery._resume_streams = _resume_streams_in_order  # type: ignore[method-assign]
        Recovery.on_recovery_completed = _on_recovery_completed_in_order  # type: ignore[method-assign]
        Consumer.getmany = _getmany_in_order  # type: ignore[method-assign]
        Consumer._wait_next_records = _wait_next_records_snapshot  # type: ignore[method-assign]
        Consumer.perform_seek = _perform_seek_tracked  # type: ignore[method-assign]
        Consumer.seek = _seek_tracked  # type: ignore[method-assign]
        Consumer.on_partitions_revoked = _revoked_tracked  # type: ignore[method-assign]
        Consumer._new_offset = _new_offset_without_duplicates  # type: ignore[method-assign]
        Fetcher._proc_offset_request = _offset_request_refreshing_metadata
        _installed = True
