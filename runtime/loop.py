"""The batched consumer loop every aiokafka service runs: poll a batch → handle the whole
batch → publish what it produced → await the broker's acknowledgements → commit the offsets
of the partitions still assigned.

Guarantees (the services' delivery guarantees rest on them):

- At least once: offsets move only after every record of the batch is handled and all it
  produced is acknowledged; a crash anywhere before redelivers the batch (handlers are
  idempotent). ``after_publish`` (async) runs once everything published is acknowledged, for
  a batch and for what ``tick`` returned (the approval-join clears its outbox there), and
  ``before_commit`` between the acknowledgements and the commit (crash tests).
- Rebalance-safe: offsets are committed only for partitions still assigned; a commit refused
  after a rebalance is logged, and the partitions' new owner redelivers.
- Per-record isolation: a record whose handling fails (a :class:`Handled` with a
  ``failure``, or an exception when the handler is retried on that record alone), or whose
  output cannot be published for a reason of its own (too large for the broker, not
  serializable), is answered by a bounded dead letter (``DeadLetter.of_raw``) and, when its
  call id can be read, a typed outcome. The other records of its batch are published and
  committed as if it were not there; the process never ends because of one record.
- Transient infrastructure errors (storage unavailable, broker unavailable) are not a
  record's fault: the batch waits and is tried again with the backoff ladder
  (:mod:`runtime.retry`), never skipped. A stop requested meanwhile ends the loop without
  committing.
- One hop per record (:mod:`runtime.hop`): its metric and span, and the ``traceparent`` its
  records are published with.

- Independent partitions (:class:`PartitionLoop`, ``partition_records``; the admission
  bench): each assigned partition has at most one batch in flight, handled, published and
  committed on its own, and every idle partition is offered a batch of at most
  ``partition_records`` records in turn, so a partition with a backlog (one tenant's flood
  on its lanes) never delays another partition's records. Within a partition records stay in
  order, and the guarantees above hold per partition; the acknowledged offsets of all
  partitions are committed together every ``COMMIT_EVERY_SECONDS`` (and when the loop
  stops), not once per batch.

- Lanes (:class:`LaneLoop`, ``lane``; the stateless stages and the executor: a record's
  tenant): the loop keeps polling while batches are handled, and each lane has at most one
  batch in flight, its next records queued meanwhile. A lane with a backlog (``BULK_RECORDS``
  or more queued) is handled, published and acknowledged on its own; the lanes with few
  records ready at once are handled together as one batch of at most ``LANE_GROUP_RECORDS``
  (and ``lane_records``), each of them in flight until that batch ends (one lane's batch
  each, a few records, paid the per-batch costs again and again). Such a group starts once
  the groups in flight have ended or have run ``LANE_GROUP_WAIT_SECONDS``: what arrives
  meanwhile goes in the next one, as a producer's linger batches records, while an idle
  loop starts a record at once. A tenant with ``BUSY_TENANT_RECORDS`` or more records in
  such lanes (``lane_tenant``) is grouped and paced apart from the quiet tenants, so a quiet
  tenant's record never rides in, or waits for, a busy tenant's group. A batch of many records
  gives way to the batches of few at its yield points (runtime/turns.py). So one tenant's
  burst, however its records spread over the partitions, never holds another tenant's
  record until it is done. Within a lane records stay in order (one operation's records
  share a lane). A partition's offset moves to its first record not yet acknowledged, for
  all partitions together every
  ``COMMIT_EVERY_SECONDS`` (and when the loop stops). A partition with ``read_ahead``
  records waiting in the process (default: a poll batch's worth) is paused (the broker keeps
  the rest) until half of that is left, while the others are polled on, so a backlog on one
  partition never keeps another's records in the broker, and a deeper read-ahead lets a
  lane's records pass another lane's backlog on the same partition; at most
  ``LANES_QUEUED_BATCHES`` times that waits in all.

One batch at a time (:class:`BatchLoop`) is the default mode. A consumer of wake-up records
whose work is elsewhere (the reconciler: the durable schedule is the ledger) fits too: its
handler acknowledges the records (``Handled(observe=False)``), and ``tick`` runs its due
work after each poll; what ``tick`` returns is published with the same isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
)
from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from config.settings import Settings
from runtime.batches import ProducerBatches
from runtime.clients import prompt_fetches
from runtime.emit import Emit, dead_letter
from runtime.health import Health
from runtime.hop import record_hop, status_of, trace_id_in
from runtime.publish import YIELD_EVERY, Answer, IsolatedPublisher, Publication
from runtime.replies import ReplySender, send_reply
from runtime.retry import Stopped, retrying
from runtime.turns import BULK_RECORDS, batch_of, turn
from schemas.envelopes import (
    Outcome,
    ReplyAddress,
    SourcePosition,
    Stage,
    Status,
)
from schemas.errors import ErrorCode, StorageUnavailable
from schemas.names import TRACEPARENT_HEADER, Topic
from telemetry.metrics import observe_records, refresh_consumer_lag
from telemetry.tracing import TraceParent, Tracer, traceparent_of

log = logging.getLogger("ratifier.runtime")

Consumed: TypeAlias = "ConsumerRecord[bytes, bytes]"
LAG_REFRESH_SECONDS = 5.0
# Independent partitions commit the acknowledged offsets of all partitions at most this often
# (one request, not one per batch); a crash redelivers at most this much more.
COMMIT_EVERY_SECONDS = 0.2
# Batched sends (``batched_sends``): a record larger than this is sent alone (the producer
# then checks its size against the broker's limit, and a refusal is its own).
BATCHED_RECORD_MAX = 64 * 1024
# Records a batched send builds before giving the event loop to other partitions' batches.
BUILD_YIELD_EVERY = 25
# Lanes: the loop stops polling while this many times the read-ahead (LaneLoop; at least a
# poll batch) of records are queued or in flight (the broker keeps the rest).
LANES_QUEUED_BATCHES = 2
# Lanes: a partition with its read-ahead of records (LaneLoop) queued or in flight is paused
# (the consumer's own pause: the broker keeps the rest of it) until at most this share of
# that is left, while the others go on being polled, so one tenant's backlog on its
# partitions never keeps another partition's records in the broker. (Resuming lower than
# where it paused: a resumed partition's prefetched records are fetched again, so it should
# not flip at every batch.)
LANES_RESUME_SHARE = 0.5
# Lanes: the records of the lanes with few records queued are handled and published together,
# at most this many in one batch (LaneLoop): one lane's batch each, a few records, left the
# per-batch costs (a poll's records spread over its partitions' lanes: 4 to 11 records a
# batch in a closed loop of reads, 2 to 3 times the CPU per call; docs/measurements.md).
LANE_GROUP_RECORDS = 500
# Lanes: a group of few-record lanes starts when the groups in flight have ended, or have been
# in flight this long (a slow group, one tenant's slow provider, holds the others no longer).
LANE_GROUP_WAIT_SECONDS = 0.02
# Lanes: a tenant with this many records or more in lanes of few records is busy: its lanes are
# grouped, and their groups paced, apart from the quiet tenants' (a quiet tenant's record rode
# in, or waited up to LANE_GROUP_WAIT_SECONDS for, a flooding tenant's group of up to
# ``lane_records``: docs/measurements.md). A quarter of BULK_RECORDS: a quiet group then holds
# at most 15 records of any one tenant.
BUSY_TENANT_RECORDS = 16
# Recover a call id from a record too broken or too big to parse whole.
_CALL_ID_PROBE = re.compile(rb'"call_id"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')


@dataclass(frozen=True, kw_only=True)
class Handled:
    """What handling one consumed record produced."""

    emits: tuple[Emit, ...] = ()
    # The handler could not handle the record: why (it is dead-lettered instead).
    failure: str | None = None
    # The call the record belongs to, when known: a failure gets a typed outcome for it.
    call_id: str | None = None
    tool: str = ""
    tenant: str | None = None
    # The call's reply address, when known: its typed outcome is copied there too.
    reply_to: ReplyAddress | None = None
    # Metric status and error code (default: those of ``emits``); the trace of ``emits``
    # (default: theirs, else the incoming ``traceparent``'s).
    status: str | None = None
    code: str | None = None
    trace_id: str | None = None
    # The span this hop continues, when not the consumed record's `traceparent` (e.g. an
    # outcome `tick` produced, continuing the hop that reported the operation unknown).
    parent: TraceParent | None = None
    observe: bool = True
    # Published by the loop's bulk producer when it has one (``bulk_producer``): a flood's
    # refusals, which must not queue in front of other calls' records (the producer keeps
    # one request in flight per broker).
    bulk: bool = False
    # Its output was published and acknowledged by the handler itself (runtime/bulk.py),
    # which also counted it: the loop has nothing to do for it (:data:`SETTLED`).
    settled: bool = False
    # The hop was recorded by the handler (the approval-join stores it with the state it
    # wrote): its output is published with this `traceparent`, and no hop of the loop's.
    traceparent: bytes | None = None


SETTLED = Handled(observe=False, settled=True)


BatchHandler = Callable[[Sequence[Consumed]], Awaitable[Sequence[Handled]]]
RecordHandler = Callable[[Consumed], Awaitable[Handled]]
Tick = Callable[[], Awaitable[Sequence[Handled]]]


def call_id_in(raw: bytes | None) -> str | None:
    """The call id named near the start of ``raw``, read without parsing it whole."""
    match = _CALL_ID_PROBE.search((raw or b"")[:4096])
    return match.group(1).decode() if match else None


def reply_to_in(raw: bytes | None) -> ReplyAddress | None:
    """The reply address a consumed call record names, when it can be read (a record that
    cannot be parsed has none: its failure outcome goes to `outcomes` only)."""
    try:
        body = json.loads(raw or b"")
        return ReplyAddress.model_validate(body["reply_to"]) if body.get("reply_to") else None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None  # pydantic's ValidationError is a ValueError


def traceparent_in(record: Consumed | None) -> bytes | None:
    """The consumed record's own `traceparent` header, as it came."""
    for name, value in (record.headers if record is not None else None) or ():
        if name == TRACEPARENT_HEADER:
            return bytes(value)
    return None


def position_of(record: Consumed) -> SourcePosition:
    return SourcePosition(topic=record.topic, partition=record.partition, offset=record.offset)


def text_key(key: bytes | None) -> str | None:
    return key.decode(errors="replace")[:256] if key else None


def failed(
    raw: bytes | None,
    *,
    reason: str,
    source: SourcePosition,
    stage: Stage | None,
    key: str | None = None,
    call_id: str | None = None,
    tool: str = "",
    tenant: str | None = None,
    replaces: Outcome | None = None,
    trace_id: str | None = None,
    reply_to: ReplyAddress | None = None,
) -> tuple[Emit, ...]:
    """What answers a record that could not be handled or published: a bounded dead letter,
    and, when its call id is known and a ``stage`` answers calls, a typed outcome. An outcome
    that could not be published (``replaces``) is answered by itself without its result (an
    effect that happened is not reported as failed); otherwise the call failed permanently."""
    now = datetime.now(UTC)
    call_id = call_id or (replaces.call_id if replaces is not None else None)
    emits = [dead_letter(raw, reason=reason, call_id=call_id, source=source, at=now, key=key)]
    if replaces is not None:
        emits.append(
            Emit(
                topic=Topic.OUTCOMES,
                key=replaces.call_id,
                value=replaces.model_copy(update={"result": None, "at": now}),
            )
        )
    elif call_id is not None and stage is not None:
        try:
            answer = Outcome.for_call(
                call_id=call_id,
                tool=tool,
                tenant=tenant,
                status=Status.FAILED,
                stage=stage,
                code=ErrorCode.PERMANENT_ERROR,
                at=now,
                trace_id=trace_id,
                reply_to=reply_to,
            )
        except ValidationError:
            pass  # not a valid call id after all: the dead letter alone answers the record
        else:
            emits.append(Emit(topic=Topic.OUTCOMES, key=call_id, value=answer))
    return tuple(emits)


async def by_key(
    records: Sequence[Consumed],
    handle: RecordHandler,
    *,
    concurrency: asyncio.Semaphore,
    key: Callable[[Consumed], Hashable] = lambda r: (r.topic, r.partition, r.key),
) -> list[Handled]:
    """Handle ``records`` with ``handle``: records of one key in order, different keys
    concurrently (bounded by ``concurrency``). An exception other than a stop costs only its
    record, which comes back as a failure; the results are in the order of ``records``."""
    groups: dict[Hashable, list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(key(record), []).append(index)
    results: list[Handled | None] = [None] * len(records)

    async def in_order(indexes: list[int]) -> None:
        async with concurrency:
            for index in indexes:
                try:
                    results[index] = await handle(records[index])
                except Stopped:
                    raise
                except Exception:
                    log.exception("internal error at %s", position_of(records[index]))
                    results[index] = Handled(failure="internal error")

    await asyncio.gather(*(in_order(indexes) for indexes in groups.values()))
    return [r if r is not None else Handled(failure="internal error") for r in results]


def _reap(busy: dict[Any, asyncio.Task[None]]) -> None:
    """Forget the batches in flight that ended; a bug in one ends the loop, as in `run`."""
    for key, task in list(busy.items()):
        if task.done():
            del busy[key]
            task.result()


def _tp(record: Consumed) -> TopicPartition:
    return TopicPartition(record.topic, record.partition)


class _Outstanding:
    """Lanes: per partition, the offsets polled and not yet acknowledged, and what may be
    committed (the first of them, else the offset after the last polled)."""

    def __init__(self) -> None:
        self._open: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self.open = 0  # records polled and not yet acknowledged

    def polled(self, tp: TopicPartition, records: Sequence[Consumed]) -> None:
        if not records:
            return
        waiting = self._open.setdefault(tp, set())
        before = len(waiting)
        waiting.update(r.offset for r in records)
        self.open += len(waiting) - before
        self._next[tp] = max(self._next.get(tp, 0), records[-1].offset + 1)

    def acknowledged(self, records: Sequence[Consumed]) -> None:
        for record in records:
            waiting = self._open.get(_tp(record))
            if waiting is not None and record.offset in waiting:
                waiting.discard(record.offset)
                self.open -= 1

    def open_in(self, tp: TopicPartition) -> int:
        """Records of ``tp`` polled and not yet acknowledged."""
        return len(self._open.get(tp, ()))

    def keep(self, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """Forget the partitions no longer ``assigned``; which they were."""
        gone = {tp for tp in self._next if tp not in assigned}
        for tp in gone:
            self.open -= len(self._open.pop(tp, ()))
            del self._next[tp]
            self._committed.pop(tp, None)
        return gone

    def committable(self) -> dict[TopicPartition, int]:
        """The offsets to commit now (those moved since the last call)."""
        out = {}
        for tp, after in self._next.items():
            waiting = self._open.get(tp)
            offset = min(waiting) if waiting else after
            if offset > self._committed.get(tp, -1):
                out[tp] = self._committed[tp] = offset
        return out


class ConsumerLoop:
    """What every mode of the loop shares (the module's docstring): handling, isolated
    publishing, commits. ``stage`` names its hops (metrics, spans); ``answers`` is the stage of
    the typed outcomes its failures get (None: no outcome, a dead letter only); ``retry_on``
    are the handler's transient errors. A mode is a subclass (:class:`BatchLoop`,
    :class:`PartitionLoop`, :class:`LaneLoop`) that :func:`consumer_loop` picks by its
    arguments."""

    def __init__(
        self,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer | None,
        *,
        stage: str,
        group: str,
        handle: BatchHandler,
        tracer: Tracer | None = None,
        answers: Stage | None = None,
        retry_on: tuple[type[BaseException], ...] = (StorageUnavailable,),
        before_commit: Callable[[], None] | None = None,
        poll_ms: int = 200,
        max_records: int = 200,
        health: Health | None = None,
        batched_sends: bool = False,
        bulk_producer: AIOKafkaProducer | None = None,
    ) -> None:
        # Batched sends partition records as the producer would, so only with its default
        # partitioner (runtime/clients.py's producers): the same key lands where it always did.
        self._partitioner: Any = getattr(producer, "_partitioner", None)
        batched_sends = batched_sends and isinstance(self._partitioner, DefaultPartitioner)
        self._settings = settings
        self._consumer = consumer
        self._producer = producer
        self._stage = stage
        self._group = group
        self._handle = handle
        self._tracer = tracer or Tracer()
        self._answers = answers
        self._retry_on = retry_on
        self._before_commit = before_commit
        self._poll_ms = poll_ms
        self._max_records = max_records
        self._health = health
        self.stopping = asyncio.Event()
        replies = (
            ReplySender(
                partial(send_reply, producer),
                namespace=settings.reply_namespace,
                timeout=settings.replies.send_timeout_seconds,
                skip_for=settings.replies.skip_seconds,
            )
            if producer is not None
            else None
        )
        self._publisher = self._publisher_on(
            producer, replies, batched=batched_sends, health=health
        )
        # Items marked ``bulk`` go out through their own producer (its own connection and
        # request in flight), so that what other calls publish never waits behind them.
        self._bulk_publisher = (
            self._publisher_on(bulk_producer, replies, batched=batched_sends, health=health)
            if producer is not None and bulk_producer is not None
            else None
        )
        self.processed = 0  # records handled and committed (or offered for commit)
        self.dead_lettered = 0

    def waiting_seconds(self) -> float:
        """How long the oldest record fetched and not yet started has waited in this process
        (its queueing delay here; 0 when none waits). Only lanes queue records in the process
        (:class:`LaneLoop`); the other modes start what they fetch at once."""
        return 0.0

    def _publisher_on(
        self,
        producer: AIOKafkaProducer | None,
        replies: ReplySender | None,
        *,
        batched: bool,
        health: Health | None,
    ) -> IsolatedPublisher | None:
        if producer is None:
            return None
        return IsolatedPublisher(
            partial(self._send, producer),
            what=self._stage,
            stop=self.stopping,
            beat=health.beat if health is not None else None,
            replies=replies,
            send_many=partial(self._send_many, producer) if batched else None,
        )

    def stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        """Poll, handle, publish, commit until stopped (the mode's :meth:`_drive`). The
        consumer and producer are the caller's (started before, stopped after)."""
        prompt_fetches(self._consumer)
        if self._health is not None:
            self._health.running()
        await self._drive()

    async def _drive(self) -> None:
        raise NotImplementedError

    async def _polled(self, lag_due: float) -> float:
        """After each poll: the liveness beat, and the lag metric when due (its next due)."""
        if self._health is not None:
            self._health.polled()
        if time.monotonic() < lag_due:
            return lag_due
        await refresh_consumer_lag(self._consumer, self._group)
        if self._health is not None:
            await self._health.observe(self._consumer)
        return time.monotonic() + LAG_REFRESH_SECONDS

    async def process(self, records: Sequence[Consumed]) -> None:
        """Handle ``records`` and publish what they produced, each record isolated from the
        others; returns when every record's output is acknowledged."""
        started = time.time_ns()
        results = await self.handle(records)
        await self.publish(list(zip(records, results, strict=True)), started)

    async def handle(self, records: Sequence[Consumed]) -> list[Handled]:
        """The handler's results for ``records``. A handler that raises on the batch (or
        answers for the wrong number of records) is run on each record alone, so that only
        the record that triggers the error is lost to it."""
        try:
            results = list(await self._retrying(lambda: self._handle(records)))
            if len(results) == len(records):
                return results
            log.error("%s: handler answered %d of %d", self._stage, len(results), len(records))
        except Stopped:
            raise
        except Exception:
            log.exception("%s: batch failed; retrying record by record", self._stage)
        results = []
        for record in records:
            try:
                alone = list(await self._retrying(partial(self._handle, [record])))
                results.append(alone[0] if len(alone) == 1 else Handled(failure="internal error"))
            except Stopped:
                raise
            except Exception:
                log.exception("%s: internal error at %s", self._stage, position_of(record))
                results.append(Handled(failure="internal error"))
        return results

    async def _retrying(self, step: Callable[[], Awaitable[Any]]) -> Any:
        return await retrying(
            step, retry_on=self._retry_on, what=f"{self._stage} storage", stop=self.stopping
        )

    def _answer(self, record: Consumed | None, handled: Handled) -> Answer:
        """A record's answer after its n-th refusal (or failure): its dead letter, with its
        outcome kept the first time, else a generic typed outcome."""

        def answer(refusals: int, reason: str) -> tuple[Emit, ...]:
            if refusals == 1:
                self.dead_lettered += 1
            keep = refusals == 1 and handled.failure is None
            return failed(
                record.value if record is not None else None,
                reason=f"{self._stage}: {reason}",
                source=position_of(record)
                if record is not None
                else SourcePosition(topic="", partition=0, offset=0),
                stage=self._answers,
                key=text_key(record.key) if record is not None else None,
                call_id=handled.call_id
                or (call_id_in(record.value) if record is not None else None),
                tool=handled.tool,
                tenant=handled.tenant,
                replaces=next(
                    (e.value for e in handled.emits if isinstance(e.value, Outcome)), None
                )
                if keep
                else None,
                trace_id=handled.trace_id,
                reply_to=handled.reply_to
                or (reply_to_in(record.value) if record is not None else None),
            )

        return answer

    def _hop(
        self, record: Consumed | None, handled: Handled, emits: tuple[Emit, ...], started: int
    ) -> bytes | None:
        parent = handled.parent or (traceparent_of(record.headers) if record is not None else None)
        if not handled.observe:
            return None
        if handled.status is not None:
            status, code = handled.status, handled.code
        else:
            status, code = status_of(emits)
        first = emits[0].value if emits else None
        return record_hop(
            self._tracer,
            self._stage,
            status=status,
            code=code,
            parent=parent,
            start_ns=started,
            end_ns=time.time_ns(),
            trace_id=handled.trace_id or trace_id_in(emits),
            call_id=handled.call_id or getattr(first, "call_id", None),
            tool=handled.tool or getattr(first, "tool", None),
        )

    async def publish(
        self, results: Sequence[tuple[Consumed | None, Handled]], started: int
    ) -> None:
        """Publish each record's emits (its answer when it failed), one record never
        affecting another (runtime/publish.py); return when all are acknowledged."""
        items: list[Publication] = []
        bulk: list[Publication] = []
        # Bulk records (a flood's refusals) without a span exporter: no span of their own
        # (nothing would record it), counted once per batch, their outputs carrying the
        # consumed record's `traceparent` (≈ 10 µs a record less: docs/measurements.md).
        quiet = not self._tracer.enabled
        counted: dict[tuple[str, str | None], int] = {}
        for n, (record, handled) in enumerate(results, 1):
            if n % YIELD_EVERY == 0:
                await turn()  # other partitions' batches run meanwhile
            if handled.settled:
                continue
            answer = self._answer(record, handled)
            if handled.failure is not None:
                if record is not None:
                    log.warning("%s: %s at %s", self._stage, handled.failure, position_of(record))
                item = Publication(answer(1, handled.failure), None, answer, refusals=1)
            else:
                item = Publication(handled.emits, None, answer)
            if quiet and handled.bulk and handled.status is not None and handled.failure is None:
                key = (handled.status, handled.code)
                counted[key] = counted.get(key, 0) + 1
                item.traceparent = traceparent_in(record)
            elif handled.traceparent is not None and handled.failure is None:
                item.traceparent = handled.traceparent
            else:
                item.traceparent = self._hop(record, handled, item.emits, started)
            (bulk if handled.bulk and handled.failure is None else items).append(item)
        seconds = (time.time_ns() - started) / 1e9
        for (status, code), count in counted.items():
            observe_records(self._stage, status=status, code=code, seconds=seconds, n=count)
        if self._bulk_publisher is None:
            items += bulk
            bulk = []
        if self._publisher is not None:
            if bulk:
                assert self._bulk_publisher is not None
                await asyncio.gather(
                    self._publisher.publish_all(items), self._bulk_publisher.publish_all(bulk)
                )
            else:
                await self._publisher.publish_all(items)

    async def _send(
        self, producer: AIOKafkaProducer, emit: Emit, traceparent: bytes | None
    ) -> Awaitable[Any]:
        future: Awaitable[Any] = await producer.send(
            self._settings.topic(emit.topic),
            key=emit.key.encode() if emit.key is not None else None,
            value=emit.value.to_bytes(),
            headers=[(TRACEPARENT_HEADER, traceparent)] if traceparent else [],
        )
        return future

    async def _send_many(
        self,
        producer: AIOKafkaProducer,
        items: Sequence[tuple[tuple[Emit, ...], bytes | None]],
    ) -> list[list[Awaitable[Any]] | None]:
        """Each of ``items`` (an item's records and traceparent) handed to the producer in one
        batch per topic-partition (in their order within it), partitioned by key as the
        producer's default partitioner does: per item, the acknowledgements of the batches
        that hold its records, or None for an item left to be sent alone (one of its records is
        keyless, large or unserializable: none of them is taken, so none goes twice)."""
        acks: list[list[Awaitable[Any]] | None] = [None] * len(items)
        partitions: dict[str, list[int]] = {}
        names: dict[Topic, str] = {}
        batches = ProducerBatches(producer, what=self._stage)
        for index, (emits, traceparent) in enumerate(items):
            if index % BUILD_YIELD_EVERY == BUILD_YIELD_EVERY - 1:
                await turn()  # other partitions' batches run meanwhile
            prepared = []
            for emit in emits:
                if emit.key is None:
                    break
                try:
                    value = emit.value.to_bytes()
                except Exception:
                    log.debug("%s: a record left to be sent alone", self._stage, exc_info=True)
                    break
                if len(value) > BATCHED_RECORD_MAX:
                    break
                topic = names.get(emit.topic) or names.setdefault(
                    emit.topic, self._settings.topic(emit.topic)
                )
                every = partitions.get(topic)
                if every is None:
                    every = partitions[topic] = list(await producer.partitions_for(topic))
                key = emit.key.encode()
                prepared.append((topic, self._partitioner(key, every, every), key, value))
            else:
                headers = [(TRACEPARENT_HEADER, traceparent)] if traceparent else []
                for topic, partition, key, value in prepared:
                    batches.add(
                        index,
                        topic=topic,
                        partition=partition,
                        key=key,
                        value=value,
                        headers=headers,
                    )
                acks[index] = []
        for ack, members in await batches.send():
            for index in members:
                taken = acks[index]
                if ack is None:
                    acks[index] = None  # its records then go alone
                elif taken is not None:
                    taken.append(ack)
        return acks

    async def _commit_offsets(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` of the partitions still assigned."""
        assigned = self._consumer.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        try:
            if offsets:
                await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError):
            # A rebalance took these partitions away; their new owner redelivers them, and
            # the handlers are idempotent.
            log.warning("%s: offset commit failed after a rebalance; redelivered", self._stage)


class BatchLoop(ConsumerLoop):
    """One batch at a time (the approval-join, the reconciler, the audit sink, the approval
    notifier): ``after_publish`` (async) runs once everything published is acknowledged, for
    a batch and for what ``tick`` returned; ``tick`` runs after each poll."""

    def __init__(
        self,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer | None,
        *,
        after_publish: Callable[[], Awaitable[None]] | None = None,
        tick: Tick | None = None,
        **common: Any,
    ) -> None:
        super().__init__(settings, consumer, producer, **common)
        self._after_publish = after_publish
        self._tick = tick

    async def _drive(self) -> None:
        """One batch at a time: poll, handle, publish, (``after_publish``), commit; then
        ``tick``."""
        lag_due = 0.0
        while not self.stopping.is_set():
            batches = await self._consumer.getmany(
                timeout_ms=self._poll_ms, max_records=self._max_records
            )
            lag_due = await self._polled(lag_due)
            try:
                if batches:
                    records = [r for recs in batches.values() for r in recs]
                    await self.process(records)
                    if self._after_publish is not None:
                        await self._retrying(self._after_publish)
                    if self._before_commit is not None:
                        self._before_commit()
                    await self._commit(batches)
                    self.processed += len(records)
                if self._tick is not None:
                    ticked = await self._retrying(self._tick)
                    await self.publish([(None, h) for h in ticked], time.time_ns())
                    if ticked and self._after_publish is not None:
                        await self._retrying(self._after_publish)
            except Stopped:
                log.info("%s: stopped while waiting; the batch is not committed", self._stage)
                return

    async def _commit(self, batches: dict[TopicPartition, list[Consumed]]) -> None:
        await self._commit_offsets(
            {
                TopicPartition(tp.topic, tp.partition): recs[-1].offset + 1
                for tp, recs in batches.items()
                if recs
            }
        )


class PartitionLoop(ConsumerLoop):
    """Independent partitions (the module's docstring): at most ``partition_records`` records
    of a partition in one batch, one batch per partition in flight."""

    def __init__(
        self,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer | None,
        *,
        partition_records: int,
        **common: Any,
    ) -> None:
        if partition_records < 1:
            raise ValueError("independent partitions take at least one record")
        super().__init__(settings, consumer, producer, **common)
        self._partition_records = partition_records
        # Offsets acknowledged and not yet committed.
        self._acked: dict[TopicPartition, int] = {}

    async def _drive(self) -> None:
        """The loop with independent partitions (the module's docstring)."""
        most = self._partition_records
        lag_due = commit_due = 0.0
        busy: dict[TopicPartition, asyncio.Task[None]] = {}
        try:
            while not self.stopping.is_set():
                _reap(busy)
                if self._acked and time.monotonic() >= commit_due:
                    commit_due = time.monotonic() + COMMIT_EVERY_SECONDS
                    await self._commit_acked()
                batches = await self._poll_idle(busy, most)
                lag_due = await self._polled(lag_due)
                for tp, records in batches.items():
                    if records:
                        busy[tp] = asyncio.create_task(self._partition_batch(tp, records))
        finally:
            # Stopping: the batches in flight finish (or stop while waiting), and what they
            # had acknowledged is committed.
            await asyncio.gather(*busy.values(), return_exceptions=True)
            await self._commit_acked()

    async def _commit_acked(self) -> None:
        """Commit the acknowledged batches' offsets (one request for every partition)."""
        acked, self._acked = self._acked, {}
        await self._commit_offsets(acked)

    async def _poll_idle(
        self, busy: dict[TopicPartition, asyncio.Task[None]], most: int
    ) -> dict[TopicPartition, list[Consumed]]:
        """At most ``most`` fetched records of each assigned partition without a batch in
        flight; when none has any, wait for records, or for a batch in flight to end (its
        partition's next records are then offered without waiting out a poll)."""
        idle = [tp for tp in sorted(self._consumer.assignment()) if tp not in busy]
        got: dict[TopicPartition, list[Consumed]] = {}
        for tp in idle:
            try:
                fetched = await self._consumer.getmany(tp, timeout_ms=0, max_records=most)
            except IllegalStateError:  # revoked meanwhile
                continue
            if fetched.get(tp):
                got[tp] = fetched[tp]
        if got:
            return got
        if not busy:  # also before the first assignment: getmany waits for it
            polled: dict[TopicPartition, list[Consumed]] = await self._consumer.getmany(
                timeout_ms=self._poll_ms, max_records=most
            )
            return polled
        if not idle:
            await asyncio.wait(
                busy.values(), timeout=self._poll_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
            return {}
        poll = asyncio.ensure_future(
            self._consumer.getmany(*idle, timeout_ms=self._poll_ms, max_records=most)
        )
        await asyncio.wait({poll, *busy.values()}, return_when=asyncio.FIRST_COMPLETED)
        if not poll.done():
            # It is still waiting, so it drained nothing: cancelling it loses no record.
            poll.cancel()
            await asyncio.wait({poll})
        if poll.cancelled() or isinstance(poll.exception(), IllegalStateError):
            return {}
        polled = poll.result()
        return polled

    async def _partition_batch(self, tp: TopicPartition, records: list[Consumed]) -> None:
        """One partition's batch: handled, published and acknowledged; its offset is then
        committed with the others' at the loop's next commit (while still assigned)."""
        try:
            with batch_of(len(records)):  # a backlog gives way to other lanes' few records
                await self.process(records)
            if self._before_commit is not None:
                self._before_commit()
            self._acked[tp] = records[-1].offset + 1
            self.processed += len(records)
        except Stopped:
            log.info("%s: stopped while waiting; %s's batch is not committed", self._stage, tp)


def _lane_is_tenant(lane: Hashable) -> Hashable:
    return lane


@dataclass
class _Group:
    """Few-record lanes forming one batch (LaneLoop): the quiet tenants' (``quiet``) or one
    busy tenant's; their records, lanes and tenants, and the largest lane's size."""

    quiet: bool
    records: list[Consumed] = field(default_factory=list)
    lanes: list[Hashable] = field(default_factory=list)
    tenants: set[Hashable] = field(default_factory=set)
    largest: int = 0

    def add(self, lane: Hashable, tenant: Hashable, records: list[Consumed]) -> None:
        self.records += records
        self.lanes.append(lane)
        self.tenants.add(tenant)
        self.largest = max(self.largest, len(records))


@dataclass(frozen=True)
class _GroupInFlight:
    task: asyncio.Task[None]
    started: float  # monotonic
    quiet: bool
    tenants: frozenset[Hashable]


class LaneLoop(ConsumerLoop):
    """Lanes (the module's docstring): records in lanes of ``lane(record)``, a lane's batch
    at most ``lane_records`` records (default: ``max_records``)."""

    def __init__(
        self,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer | None,
        *,
        lane: Callable[[Consumed], Hashable],
        lane_tenant: Callable[[Hashable], Hashable] | None = None,
        lane_records: int | None = None,
        read_ahead: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(settings, consumer, producer, **common)
        self._lane = lane
        self._lane_records = lane_records or self._max_records
        # A partition is paused with this many records waiting (default: a poll batch's).
        self._read_ahead = read_ahead or self._max_records
        # Per lane with records queued: when its oldest queued record was fetched (monotonic).
        self._queued_since: dict[Hashable, float] = {}
        # The tenant of a lane (default: the lane is a tenant's).
        self._lane_tenant = lane_tenant or _lane_is_tenant
        # The groups of few-record lanes in flight, and when the lanes left waiting for them
        # may start anyway (None: none waits).
        self._groups: list[_GroupInFlight] = []
        self._group_due: float | None = None

    def waiting_seconds(self) -> float:
        """The age of the oldest queued record (a lane waiting for its batch in flight, or
        for the loop to start it): fair admission's measure of this stage's queue
        (streams/fair_share.py). While the loop holds off polling, the broker keeps the rest of
        the backlog and the queued records' age goes on growing with it."""
        if not self._queued_since:
            return 0.0
        return max(0.0, time.monotonic() - min(self._queued_since.values()))

    async def _drive(self) -> None:
        """The loop with lanes (the module's docstring)."""
        lane = self._lane
        lag_due = commit_due = 0.0
        busy: dict[Hashable, asyncio.Task[None]] = {}
        queued: dict[Hashable, list[Consumed]] = {}
        since = self._queued_since
        offsets = _Outstanding()
        most = self._max_records
        try:
            while not self.stopping.is_set():
                _reap(busy)
                revoked = offsets.keep(self._consumer.assignment())
                if revoked:
                    # Their new owner redelivers them (handlers are idempotent).
                    for key in list(queued):
                        queued[key] = [r for r in queued[key] if _tp(r) not in revoked]
                        if not queued[key]:
                            del queued[key]
                            since.pop(key, None)
                self._start_ready(queued, busy, offsets)
                if time.monotonic() >= commit_due:
                    commit_due = time.monotonic() + COMMIT_EVERY_SECONDS
                    await self._commit_offsets(offsets.committable())
                held_all = self._hold(offsets, self._read_ahead)
                full = offsets.open >= max(most, self._read_ahead) * LANES_QUEUED_BATCHES
                if busy and (held_all or full):
                    # Enough waits here: the broker keeps the rest until a lane's batch ends
                    # (or the lanes waiting for the groups in flight may start).
                    wait = self._poll_ms / 1000
                    if self._group_due is not None:
                        wait = min(wait, max(0.0, self._group_due - time.monotonic()))
                    await asyncio.wait(
                        busy.values(), timeout=wait, return_when=asyncio.FIRST_COMPLETED
                    )
                    lag_due = await self._polled(lag_due)  # alive, though not polling
                    continue
                polled = await self._poll_while(busy, most)
                lag_due = await self._polled(lag_due)
                fetched = time.monotonic()
                for tp, records in polled.items():
                    offsets.polled(tp, records)
                    for record in records:
                        key = lane(record)
                        queued.setdefault(key, []).append(record)
                        since.setdefault(key, fetched)
        finally:
            # Stopping: the batches in flight finish (or stop while waiting), and what they
            # had acknowledged is committed.
            since.clear()
            await asyncio.gather(*busy.values(), return_exceptions=True)
            await self._commit_offsets(offsets.committable())
            with contextlib.suppress(IllegalStateError):  # a consumer stopped meanwhile
                self._hold(_Outstanding(), most)  # nothing held: a loop started again polls all

    def _start_ready(
        self,
        queued: dict[Hashable, list[Consumed]],
        busy: dict[Hashable, asyncio.Task[None]],
        offsets: _Outstanding,
    ) -> None:
        """Start the queued lanes with no batch in flight: a lane with a backlog (bulk, a slice
        of at most ``lane_records``) alone, the lanes with few records together, in groups of
        at most ``lane_records`` and ``LANE_GROUP_RECORDS`` records (one handling and one
        publication for all of them; each of its lanes has its batch in flight until the
        group's ends), once the groups in flight they would wait for have ended or run
        ``LANE_GROUP_WAIT_SECONDS``. A tenant with ``BUSY_TENANT_RECORDS`` or more records in
        such lanes has groups of its own, so that a quiet tenant's records never ride in a busy
        tenant's group; a lane waits for the groups in flight holding its tenant's records, and
        a quiet one for the quiet groups too, never for another tenant's busy group."""
        cap = min(self._lane_records, LANE_GROUP_RECORDS)
        few = min(BULK_RECORDS, cap)
        since = self._queued_since
        tenant_of = self._lane_tenant
        ready = [key for key in queued if key not in busy]
        # Each tenant's records in lanes of few records: a busy tenant's lanes go apart.
        totals: dict[Hashable, int] = {}
        for key in ready:
            count = len(queued[key])
            if count < few:
                tenant = tenant_of(key)
                totals[tenant] = totals.get(tenant, 0) + count
        # A group starts once the groups in flight it waits for have ended (or waited long
        # enough): the few records arriving meanwhile go in the next, as a producer's linger
        # batches them. A tenant's own groups pace it whatever their kind, so a tenant alone
        # (a one-tenant run) has one chain of groups, as its load crosses the threshold or not.
        now = time.monotonic()
        self._groups = [g for g in self._groups if not g.task.done()]
        self._group_due = None
        forming: dict[Hashable, _Group] = {}
        for key in ready:
            records = queued[key]
            if len(records) < few:
                tenant = tenant_of(key)
                quiet = totals[tenant] < BUSY_TENANT_RECORDS
                due = min(
                    (
                        g.started + LANE_GROUP_WAIT_SECONDS
                        for g in self._groups
                        if (quiet and g.quiet) or tenant in g.tenants
                    ),
                    default=now,
                )
                if due > now:
                    self._group_due = min(due, self._group_due or due)
                    continue
                kind = None if quiet else tenant
                group = forming.setdefault(kind, _Group(quiet=quiet))
                if group.records and len(group.records) + len(records) > cap:
                    self._start_group(group, busy, offsets, now)
                    group = forming[kind] = _Group(quiet=quiet)
                del queued[key]
                since.pop(key)
                group.add(key, tenant, records)
                continue
            del queued[key]
            polled_at = since.pop(key)
            backlog = len(records)  # a lane's backlog is bulk, however it is sliced
            if len(records) > self._lane_records:
                cut = self._lane_records
                records, queued[key] = records[:cut], records[cut:]
                # The rest keeps the slice's fetch time (its age at most that).
                since[key] = polled_at
            self._start(records, [key], busy, offsets, backlog)
        for group in forming.values():
            if group.records:
                self._start_group(group, busy, offsets, now)

    def _start_group(
        self,
        group: _Group,
        busy: dict[Hashable, asyncio.Task[None]],
        offsets: _Outstanding,
        now: float,
    ) -> None:
        # A group is as small as its largest lane: it gives way to no one. (Made bulk from 64
        # records, a busy tenant's group gave way at each yield point to every small batch,
        # its own tenant's groups of the other kind too: a one-tenant open loop of reads at
        # 1,800 calls/s went from 70-73 ms at the p50 to 130-172 ms; docs/measurements.md.)
        task = self._start(group.records, group.lanes, busy, offsets, group.largest)
        self._groups.append(
            _GroupInFlight(
                task=task, started=now, quiet=group.quiet, tenants=frozenset(group.tenants)
            )
        )

    def _start(
        self,
        records: list[Consumed],
        lanes: list[Hashable],
        busy: dict[Hashable, asyncio.Task[None]],
        offsets: _Outstanding,
        backlog: int,
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self._lane_batch(records, offsets, backlog))
        for key in lanes:
            busy[key] = task
        return task

    def _hold(self, offsets: _Outstanding, most: int) -> bool:
        """Pause the assigned partitions with ``most`` records or more waiting in the process,
        resume the paused ones with at most ``LANES_RESUME_SHARE`` of that left; whether every
        assigned partition is paused now."""
        assigned = self._consumer.assignment()
        paused = self._consumer.paused() & assigned
        full = {tp for tp in assigned - paused if offsets.open_in(tp) >= most}
        if full:
            self._consumer.pause(*full)
        resumed = {tp for tp in paused if offsets.open_in(tp) <= most * LANES_RESUME_SHARE}
        if resumed:
            self._consumer.resume(*resumed)
        return bool(assigned) and (paused | full) - resumed == assigned

    async def _poll_while(
        self, busy: dict[Hashable, asyncio.Task[None]], most: int
    ) -> dict[TopicPartition, list[Consumed]]:
        """Fetched records (at most ``most``): waited for, or, while batches are in flight,
        until one of them ends (its lane's queued records are then started without waiting out
        a poll)."""
        poll = asyncio.ensure_future(
            self._consumer.getmany(timeout_ms=self._poll_ms, max_records=most)
        )
        if busy:
            due = self._group_due
            await asyncio.wait(
                {poll, *busy.values()},
                timeout=None if due is None else max(0.0, due - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not poll.done():
                # It is still waiting, so it drained nothing: cancelling it loses no record.
                poll.cancel()
                await asyncio.wait({poll})
            if poll.cancelled():
                return {}
        polled: dict[TopicPartition, list[Consumed]] = await poll
        return polled

    async def _lane_batch(
        self, records: list[Consumed], offsets: _Outstanding, backlog: int
    ) -> None:
        """One lane's batch (a slice of its ``backlog``): handled, published and
        acknowledged; its partitions' offsets then move with the loop's next commit."""
        try:
            with batch_of(backlog):  # a burst gives way to other lanes' few records
                await self.process(records)
            if self._before_commit is not None:
                self._before_commit()
            offsets.acknowledged(records)
            self.processed += len(records)
        except Stopped:
            log.info("%s: stopped while waiting; a lane's batch is not committed", self._stage)


def consumer_loop(
    settings: Settings,
    consumer: AIOKafkaConsumer,
    producer: AIOKafkaProducer | None,
    *,
    lane: Callable[[Consumed], Hashable] | None = None,
    lane_tenant: Callable[[Hashable], Hashable] | None = None,
    lane_records: int | None = None,
    read_ahead: int | None = None,
    partition_records: int | None = None,
    after_publish: Callable[[], Awaitable[None]] | None = None,
    tick: Tick | None = None,
    **common: Any,
) -> ConsumerLoop:
    """The loop of the mode its arguments ask for: lanes (``lane``), independent partitions
    (``partition_records``), else one batch at a time (``after_publish``, ``tick``). The other
    arguments are :class:`ConsumerLoop`'s."""
    if lane is not None:
        if partition_records is not None or tick is not None or after_publish is not None:
            raise ValueError("lanes take no tick, no after_publish and no partition_records")
        return LaneLoop(
            settings,
            consumer,
            producer,
            lane=lane,
            lane_tenant=lane_tenant,
            lane_records=lane_records,
            read_ahead=read_ahead,
            **common,
        )
    if lane_records is not None or read_ahead is not None or lane_tenant is not None:
        raise ValueError("lane_records, lane_tenant or read_ahead without a lane")
    if partition_records is not None:
        if tick is not None or after_publish is not None:
            raise ValueError("independent partitions take no tick and no after_publish")
        return PartitionLoop(
            settings, consumer, producer, partition_records=partition_records, **common
        )
    return BatchLoop(settings, consumer, producer, after_publish=after_publish, tick=tick, **common)
