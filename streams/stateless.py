"""The stateless stages (validator, authorizer) on the runtime's consumer loop.

Each stage is its own consumer group on its own input topic (`ratifier-validator` on
`calls.proposed`, `ratifier-authorizer` on `calls.validated`), so each keeps its own
offsets, and the loop commits a partition's offset only after every record before it was
handled and all it produced was acknowledged (runtime/loop.py). They used to be faust agents;
faust's ack bookkeeping could survive a rebalance (after a broker restart) with records
counted as seen that were never processed, losing calls (docs/reliability.md, "Offsets of the
stream stages"), and a faust hop cost ten times a plain aiokafka relay (bench/RESULTS.md).
The approval-join, whose changelog-backed table is faust's reason to be here, stays on faust.

On first start after the move, a stage group without committed offsets adopts those of the
former faust group (``ratifier-streams``) on its input topic, so an upgrade neither replays
the topic's history nor skips anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from commands.catalog import Catalog
from commands.freezes import FixedFreezes, FreezeSource
from commands.limits import Unverified
from commands.validate import Limits
from config.settings import Settings
from feeds.policies import PolicyFeed
from runtime.bulk import BulkRecord, BulkRecords, BulkSend
from runtime.clients import kafka_admin, kafka_consumer, kafka_producer, redis_client
from runtime.emit import Emit
from runtime.health import Health
from runtime.heap import settle_heap
from runtime.identity import ContextKeys
from runtime.load import report_waiting
from runtime.loop import (
    SETTLED,
    Consumed,
    ConsumerLoop,
    Handled,
    consumer_loop,
    position_of,
    text_key,
    traceparent_in,
)
from runtime.retry import retrying
from runtime.turns import turn
from schemas.envelopes import Status, ValidatedCall
from schemas.errors import ErrorCode, StorageUnavailable
from schemas.lanes import LANE_SEPARATOR
from schemas.names import AUTHORIZER_GROUP, STREAMS_APP_ID, VALIDATOR_GROUP, Topic
from schemas.vocabulary import StreamStage
from streams.admission import Admission, Screening, release_slots, watch_lag
from streams.approval import Rules, auto_audits
from streams.authorizer import BudgetsFetch, ResourcesFetch, on_validated_batch
from streams.fair_share import FairShedder, watch_fair_share
from streams.join_store import Audit
from streams.limiter import FleetLimiter
from streams.repeats import OperationsSeen
from streams.validator import on_proposed
from telemetry.metrics import observe_records
from telemetry.tracing import Tracer, trace_id_of

log = logging.getLogger("ratifier.streams")

BATCH_MAX = 500  # records per poll: a backlog drains in large batches
# Each lane (a partition and the tenant of the key: ``tenant_lane``) has one batch of at most
# this many records in flight; a lane with a backlog is processed on its own, so one tenant's
# backlog on its lanes (schemas/lanes.py) never delays another tenant's records, in its
# partition or another (docs/operations.md, "Fair admission"; issue 45), and the lanes with
# few records go together (runtime/loop.py, at most 500 a batch: issue 46). The validator's
# batches take all that a fetch brought (≈ 2,400 proposals; aiokafka fetches a partition's
# next records only once those are taken), while the handlers and the publisher give the
# event loop to the other partitions every few records. The authorizer keeps batches of 500:
# batches of 100 did not measurably shorten another tenant's wait in the flood
# (docs/measurements.md), and more batches cost more round trips under a backlog.
PARTITION_BATCH = {StreamStage.VALIDATOR: 5000, StreamStage.AUTHORIZER: BATCH_MAX}
YIELD_EVERY = 5  # records a handler decides before letting other partitions' batches run
# The producer's batches (bytes): a partition batch's outputs (500 refusals of ≈ 0.6 KiB over
# a few partitions) go out as one batch per topic-partition (runtime/loop.py, batched sends);
# within the broker's `max.message.bytes` (kafka_max_message_bytes, at least 64 KiB).
PRODUCER_BATCH_BYTES = 256 * 1024


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    name: StreamStage  # as in `settings.streams.stages`
    source: Topic
    group: str


SPECS = (
    StageSpec(name=StreamStage.VALIDATOR, source=Topic.PROPOSED, group=VALIDATOR_GROUP),
    StageSpec(name=StreamStage.AUTHORIZER, source=Topic.VALIDATED, group=AUTHORIZER_GROUP),
)


# Records a stage reads ahead of what it handled, at most (runtime/loop.py, lanes: polls of
# this many, two polls' worth in the process): past a backlogged tenant, to the other
# tenants' records behind it in the same partition.
LANE_POLL_RECORDS = 5000


def tenant_lane(record: Consumed) -> Hashable:
    """A record's lane in a stateless stage (issue 45, isolation inside a partition): its
    partition and the tenant of its key (``<tenant>#<lane>``, schemas/lanes.py, unverified:
    it only schedules), so that one tenant's backlog never holds another tenant's records
    behind it in the same partition, and each tenant's records stay in order. A record keyed
    otherwise (by call id: older agents, load generators) is in its partition's lane, as
    before."""
    tenant, separator, _ = (record.key or b"").rpartition(LANE_SEPARATOR.encode())
    return (record.partition, tenant if separator else None)


def lane_tenant(lane: Hashable) -> Hashable:
    """The tenant of a lane of :func:`tenant_lane` (None: keyed otherwise), by which the lanes
    with few records are grouped (runtime/loop.py, ``BUSY_TENANT_RECORDS``)."""
    _, tenant = cast("tuple[int, bytes | None]", lane)
    return tenant


def _handled(emits: tuple[Emit, ...]) -> Handled:
    return Handled(emits=emits)


# A refusal's metric status and code (what ``status_of`` would read from its outcome).
REJECTED, RATE_LIMITED = Status.REJECTED.value, ErrorCode.RATE_LIMITED.value


def validator_handler(
    *,
    catalog: Catalog,
    limits: Limits,
    feed: PolicyFeed,
    admission: Admission | None = None,
    bulk: Callable[[], BulkRecords | None] = lambda: None,
) -> Callable[[Sequence[Consumed]], Awaitable[list[Handled]]]:
    """``admission``: fleet limits and shedding (streams/admission.py); None: none.
    ``bulk``: where the handler publishes the refusals it can stamp (runtime/bulk.py), once
    there is one; the others are published by the loop."""

    async def handle(records: Sequence[Consumed]) -> list[Handled]:
        started = time.perf_counter()
        now = datetime.now(UTC)
        version = feed.current.version
        publisher = bulk()
        # Admission first judges the calls it can read without validating them: a flood's
        # refusals are decided before any of its calls is validated (streams/admission.py).
        screening = (
            await admission.screen(
                [(r.value, r.headers) for r in records],
                limits=limits,
                now=now,
                policy_version=version,
                stamping=publisher is not None,
            )
            if admission is not None
            else Screening()
        )
        decided: list[tuple[Emit, ...]] = []
        later: list[int] = []  # validated before admission judges them
        validated = 0
        for index, record in enumerate(records):
            refusal = screening.refusals.get(index)
            if refusal is not None:
                decided.append(refusal)
                continue
            if index in screening.stamped:
                decided.append(())  # settled below
                continue
            decided.append(
                on_proposed(
                    record.value,
                    source=position_of(record),
                    key=text_key(record.key),
                    catalog=catalog,
                    limits=limits,
                    now=now,
                    trace_id=trace_id_of(record.headers),
                    policy_version=version,
                )
            )
            if index not in screening.judged:
                later.append(index)
            validated += 1
            if validated % YIELD_EVERY == 0:
                # Other partitions' batches run meanwhile (a flood's batch holds the loop
                # for a slice, not for the whole batch).
                await turn()
        refused = set(screening.refusals)
        if admission is not None and later:
            judged = await admission.admit(
                [decided[i] for i in later], now=now, policy_version=version
            )
            for index, emits in zip(later, judged, strict=True):
                if emits is not decided[index]:
                    refused.add(index)
                decided[index] = emits
        # The stamped refusals go out last, once nothing else of the batch can fail (a batch
        # handled again after an error would publish them twice).
        stamped = sorted(screening.stamped.items())
        sending = (
            await _sent(
                publisher,
                [
                    BulkRecord(
                        topic=Topic.OUTCOMES,
                        key=stamp.call_id,
                        value=stamp.json,
                        traceparent=traceparent_in(records[index]),
                    )
                    for index, stamp in stamped
                ],
            )
            if publisher is not None and stamped
            else None
        )
        # Refusals go out through the loop's bulk producer (runtime/loop.py, Handled.bulk).
        handled = [
            Handled(emits=emits, bulk=True, status=REJECTED, code=RATE_LIMITED)
            if i in refused
            else SETTLED  # a stamped refusal's place, settled below
            if i in screening.stamped
            else Handled(emits=emits)
            for i, emits in enumerate(decided)
        ]
        if stamped:
            settled = await _settled(sending, len(stamped))
            for (index, stamp), done in zip(stamped, settled, strict=True):
                handled[index] = (
                    SETTLED
                    if done
                    else Handled(
                        emits=(stamp.emit(),), bulk=True, status=REJECTED, code=RATE_LIMITED
                    )
                )
            observe_records(
                StreamStage.VALIDATOR.stage.value,
                status=REJECTED,
                code=RATE_LIMITED,
                seconds=time.perf_counter() - started,
                n=sum(settled),
            )
        return handled

    return handle


async def _sent(publisher: BulkRecords, records: list[BulkRecord]) -> BulkSend | None:
    try:
        return await publisher.send(records)
    except Exception:  # not handed over (no metadata, say): they go the usual way
        log.warning("stamped refusals not published; they go the usual way", exc_info=True)
        return None


async def _settled(sending: BulkSend | None, count: int) -> list[bool]:
    """Per stamped refusal, whether it was published and acknowledged (False: the loop
    publishes it the usual way, which waits out a broker away and answers a refusal)."""
    return await sending.acknowledged() if sending is not None else [False] * count


def authorizer_handler(
    *,
    catalog: Catalog,
    keys: ContextKeys,
    feed: PolicyFeed,
    fetch_many: ResourcesFetch,
    freezes: FreezeSource | None = None,
    operations: OperationsSeen | None = None,
    budgets: BudgetsFetch | None = None,
    receipts: Rules | None = None,
    audit: Callable[[Sequence[Audit]], Awaitable[None]] | None = None,
) -> Callable[[Sequence[Consumed]], Awaitable[list[Handled]]]:
    """``receipts``: the approval service's keys, to commit `@approval("auto")` calls here
    with a signed receipt; their audit rows go to ``audit`` before the batch is published."""
    frozen = freezes or FixedFreezes()

    async def handle(records: Sequence[Consumed]) -> list[Handled]:
        parsed: list[ValidatedCall | None] = []
        for n, record in enumerate(records, 1):
            try:
                parsed.append(ValidatedCall.model_validate_json(record.value or b""))
            except ValidationError:
                parsed.append(None)
            if n % YIELD_EVERY == 0:
                await turn()  # other lanes' batches run meanwhile (streams/authorizer.py)
        decided = await on_validated_batch(
            [c for c in parsed if c is not None],
            catalog=catalog,
            keys=keys,
            policies=feed.current,
            fetch_many=fetch_many,
            now=datetime.now(UTC),
            freezes=frozen.current,
            operations=operations,
            budgets=budgets,
            receipts=receipts,
        )
        if receipts is not None and audit is not None:
            # Recorded before the commands are published (at least once, once per key).
            readable = [r for r, call in zip(records, parsed, strict=True) if call is not None]
            await audit(
                [
                    Audit(
                        entry=entry,
                        event_key=f"{r.topic}:{r.partition}:{r.offset}#{n}:{entry.kind}",
                    )
                    for r, emits in zip(readable, decided, strict=True)
                    for n, entry in enumerate(auto_audits(emits))
                ]
            )
        outputs = iter(decided)
        return [
            _handled(next(outputs)) if call is not None else Handled(failure="unreadable")
            for call in parsed
        ]

    return handle


async def adopt_offsets(settings: Settings, spec: StageSpec) -> None:
    """Give ``spec``'s group the former faust group's offsets on its input topic, once: only
    while the group has none (a group already in use is never touched)."""
    topic = settings.topic(spec.source)
    group = settings.group(spec.group)
    admin = kafka_admin(settings)
    await admin.start()
    try:
        own = await admin.list_consumer_group_offsets(group)
        if any(tp.topic == topic for tp in own):
            return
        former = await admin.list_consumer_group_offsets(settings.group(STREAMS_APP_ID))
    finally:
        await admin.close()
    offsets = {tp: meta.offset for tp, meta in former.items() if tp.topic == topic}
    offsets = {tp: o for tp, o in offsets.items() if o >= 0}
    if not offsets:
        return
    seeder = kafka_consumer(settings, group=group)
    await seeder.start()
    try:
        seeder.assign(list(offsets))
        await seeder.commit({TopicPartition(t.topic, t.partition): o for t, o in offsets.items()})
        log.info("%s: adopted the faust group's offsets on %s: %s", group, topic, offsets)
    except KafkaError as exc:  # another worker's group is already running: it owns them
        log.info("%s: offsets not adopted (%s)", group, exc)
    finally:
        await seeder.stop()


class StatelessStages:
    """The validator and authorizer loops of one streams worker (those in ``stages``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        stages: frozenset[StreamStage],
        catalog: Catalog,
        feed: PolicyFeed,
        keys: ContextKeys,
        limits: Limits,
        fetch_many: ResourcesFetch,
        tracer: Tracer,
        freezes: FreezeSource | None = None,
        operations: OperationsSeen | None = None,
        budgets: BudgetsFetch | None = None,
        health: Health | None = None,
        receipts: Rules | None = None,
        audit: Callable[[Sequence[Audit]], Awaitable[None]] | None = None,
    ) -> None:
        self._settings = settings
        self._health = health
        self._tracer = tracer
        self._specs = [s for s in SPECS if s.name in stages]
        # Fleet admission (streams/admission.py), shared through Redis by every validator;
        # fair shares (streams/fair_share.py) unless turned off.
        self._redis = redis_client(settings)
        fair_on = settings.admission.fair_target_seconds > 0
        self.admission = Admission(
            limiter=FleetLimiter(self._redis, settings.admission, prefix=settings.topic_prefix),
            fair=FairShedder(settings.admission) if fair_on else None,
            catalog=catalog,
            keys=keys,
            limits=lambda: feed.current.limits,
            unverified=Unverified(
                rate=settings.admission.unverified_rate,
                burst=settings.admission.unverified_burst,
                fleet_rate=settings.admission.unverified_fleet_rate,
                fleet_burst=settings.admission.unverified_fleet_burst,
            ),
        )
        self._handlers = {
            StreamStage.VALIDATOR: validator_handler(
                catalog=catalog,
                limits=limits,
                feed=feed,
                admission=self.admission,
                bulk=lambda: self._bulk,
            ),
            StreamStage.AUTHORIZER: authorizer_handler(
                catalog=catalog,
                keys=keys,
                feed=feed,
                fetch_many=fetch_many,
                operations=operations,
                freezes=freezes,
                budgets=budgets,
                receipts=receipts,
                audit=audit,
            ),
        }
        # The validator publishes its stamped refusals itself (runtime/bulk.py), through the
        # refusals' producer once started; not with a span exporter (each refusal then has a
        # span of its own, which the loop records).
        self._bulk: BulkRecords | None = None
        self._loops: list[ConsumerLoop] = []
        self._stopping = asyncio.Event()
        self.finished = asyncio.Event()  # the loops ended and the clients are closed

    @property
    def stages(self) -> tuple[StreamStage, ...]:
        """The stages this process runs (none: it serves only the approval API)."""
        return tuple(s.name for s in self._specs)

    def stop(self) -> None:
        self._stopping.set()
        for loop in self._loops:
            loop.stop()

    async def stopped(self, grace_seconds: float) -> None:
        """Stop, and wait up to ``grace_seconds`` for the current batches to be committed."""
        self.stop()
        if self._specs:
            try:
                await asyncio.wait_for(self.finished.wait(), grace_seconds)
            except TimeoutError:
                log.warning("stateless stages still busy after %.0fs; not committed", grace_seconds)

    async def run(self) -> None:
        """Run every configured stage until stopped; the broker being away at start is
        waited out."""
        try:
            await self._run()
        finally:
            self.finished.set()

    async def _run(self) -> None:
        if not self._specs:
            return
        settings = self._settings
        batch_bytes = min(PRODUCER_BATCH_BYTES, settings.limits.kafka_max_message_bytes)
        producer = kafka_producer(settings, max_batch_size=batch_bytes)
        # Admission's refusals have a producer of their own (runtime/loop.py, Handled.bulk):
        # a flood's refusals never hold up what the stages publish for other calls.
        refusals = kafka_producer(settings, max_batch_size=batch_bytes)
        consumers: list[AIOKafkaConsumer] = []
        for spec in self._specs:
            await retrying(
                partial(adopt_offsets, settings, spec),
                retry_on=(KafkaError, OSError),
                what=f"{spec.name} offsets",
                stop=self._stopping,
            )
            consumer = kafka_consumer(
                settings,
                settings.topic(spec.source),
                group=settings.group(spec.group),
                max_poll_records=BATCH_MAX,
            )
            consumers.append(consumer)
            self._loops.append(
                consumer_loop(
                    settings,
                    consumer,
                    producer,
                    stage=spec.name.stage.value,
                    group=settings.group(spec.group),
                    handle=self._handlers[spec.name],
                    tracer=self._tracer,
                    answers=spec.name.stage,
                    retry_on=(StorageUnavailable,),
                    max_records=LANE_POLL_RECORDS,
                    poll_ms=100,
                    health=self._health,
                    lane=tenant_lane,
                    lane_tenant=lane_tenant,
                    lane_records=PARTITION_BATCH[spec.name],
                    batched_sends=True,
                    bulk_producer=refusals if spec.name is StreamStage.VALIDATOR else None,
                )
            )
        if self._stopping.is_set():
            return
        await producer.start()
        try:
            await refusals.start()
            if not self._tracer.enabled:
                self._bulk = BulkRecords(settings, refusals, what=StreamStage.VALIDATOR.value)
            for consumer in consumers:
                await consumer.start()
            log.info("stateless stages running: %s", ", ".join(s.name for s in self._specs))
            admitting = any(s.name is StreamStage.VALIDATOR for s in self._specs)
            helpers = (
                [
                    watch_lag(settings, self.admission, self._stopping),
                    release_slots(settings, self.admission, self._stopping),
                ]
                if admitting
                else []
            )
            fair = self.admission.fair
            if admitting and fair is not None:
                helpers.append(
                    watch_fair_share(
                        self._redis, fair, topic_prefix=settings.topic_prefix, stop=self._stopping
                    )
                )
            if settings.admission.fair_target_seconds > 0:
                # Every lane stage's queueing delay, for the validators' fair shares.
                helpers.append(
                    report_waiting(
                        self._redis,
                        topic_prefix=settings.topic_prefix,
                        stage="stages",
                        waiting=[loop.waiting_seconds for loop in self._loops],
                        period=settings.admission.fair_tick_seconds,
                        stop=self._stopping,
                    )
                )
            settle_heap("stages")  # what start-up built is not walked again (runtime/heap.py)
            await asyncio.gather(*(loop.run() for loop in self._loops), *helpers)
        finally:
            for consumer in consumers:
                await consumer.stop()
            await refusals.stop()
            await producer.stop()
            await self.admission.limiter.close()
