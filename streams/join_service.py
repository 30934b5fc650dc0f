"""`ratifier approval-join`: the approval-join as a service like the reconciler — the
runtime's service shell (runtime/shell.py) around its consumer loop (runtime/loop.py) on
`calls.authorized` and `approvals.decided` (partitioned by call id; one consumer group, so
several workers share the partitions), its state in PostgreSQL (streams/join_store.py), the
decisions those of streams/approval.py (pure) with their I/O (streams/join_decisions.py).

A batch of records is one transaction: the partitions' applied offsets and the calls are
locked, records already applied are skipped (a redelivery changes nothing), the states,
the decision's audit rows, the ends of requests and the records to publish (the outbox) are
written, and committed. The worker then takes its outbox rows (held in a transaction), the
loop publishes them and waits for the broker's acknowledgements, the rows are cleared, and
only then are the Kafka offsets committed. A worker killed at any step leaves either nothing
(rolled back) or a committed state with its records in the outbox, which any worker of the
deployment publishes (``tick``: rows older than ``ORPHAN_AGE_SECONDS`` that no live worker
holds). The timer is a query on the states' due time (``TICK_SECONDS``): expiry, a hold's end,
forgetting, each in a transaction of its own like a batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeAlias

import psycopg
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from commands.catalog import Catalog
from config.settings import Settings
from feeds.freezes import FleetFreezes
from feeds.policies import PolicyFeed
from runtime.clients import database_conninfo, pg_pool
from runtime.crash_points import NO_CRASH_POINTS, CrashPoint, CrashPoints
from runtime.health import Health
from runtime.hop import record_emits_hop
from runtime.loop import ConsumerLoop, Handled, call_id_in, consumer_loop, position_of, text_key
from runtime.shell import ServiceShell, ShellWorker, StartupHook, run_until
from runtime.startup import DEPENDENCY_ERRORS, KafkaClients, open_pool
from runtime.supervision import SideTask
from schemas.envelopes import Stage
from schemas.errors import StorageUnavailable
from schemas.names import APPROVAL_JOIN_GROUP, Topic
from streams.approval import ApprovalState, EndedRequest
from streams.approval import due as is_due
from streams.emit import dead_letter
from streams.join_decisions import ApprovalJoin, Joined
from streams.join_secrets import (
    SecretsUnavailable,
    SourceReader,
    at_rest,
    kept_sources,
    secret_calls,
)
from streams.join_store import (
    Audit,
    Changes,
    JoinStore,
    Publish,
    Source,
    Sources,
    Taken,
    due_at,
)
from streams.stages_service import limits_from
from streams.storage import StreamStorage
from telemetry.tracing import Tracer, parse_traceparent, traceparent_of, tracer_from

log = logging.getLogger("ratifier.approvals")

# The timer's period, and the states it handles per turn (one transaction).
TICK_SECONDS = 1.0
DUE_PER_TICK = 200
# A record left in the outbox this long is a dead worker's (a live one takes its records at
# once, in the transaction's wake): any worker publishes it. How often that is looked for.
ORPHAN_AGE_SECONDS = 2.0
ORPHANS_EVERY_SECONDS = 1.0
ORPHANS_PER_TURN = 500
# A poll's records at most: one transaction, one advisory lock per call id.
MAX_RECORDS = 300
POLL_MS = 200
CONNECT_TIMEOUT_SECONDS = 5.0
SOURCES = (Topic.AUTHORIZED, Topic.APPROVALS_DECIDED)

Consumed: TypeAlias = "ConsumerRecord[bytes, bytes]"


@dataclass(kw_only=True)
class _Writes:
    """What one transaction collects to write: audit rows, ended requests, records."""

    started: int
    now: datetime
    audits: list[Audit] = field(default_factory=list)
    ended: list[EndedRequest] = field(default_factory=list)
    publish: list[Publish] = field(default_factory=list)

    def add(self, joined: Joined, *, event: str, hop: bytes, call_id: str | None) -> None:
        entries = [a for s in joined.steps for a in s.audits]
        self.audits.extend(
            Audit(entry=a, event_key=f"{event}#{n}:{a.kind}") for n, a in enumerate(entries)
        )
        self.ended.extend(e for s in joined.steps for e in s.ended)
        self.publish.extend(
            Publish(emit=e, call_id=call_id, traceparent=hop) for s in joined.steps for e in s.emits
        )

    def changes(
        self,
        states: dict[str, ApprovalState | None],
        before: dict[str, ApprovalState | None],
        *,
        catalog: Catalog,
        known: dict[str, Source],
        positions: dict[tuple[str, int], int] | None = None,
    ) -> Changes:
        """What to write: the states that changed, as kept at rest (secret arguments masked,
        with where to read them back: streams/join_secrets.py)."""
        changed = {c: s for c, s in states.items() if s != before.get(c)}
        return Changes(
            states={c: at_rest(s, catalog) if s is not None else None for c, s in changed.items()},
            sources={c: kept_sources(s, catalog, known) for c, s in changed.items()},
            audits=self.audits,
            ended=self.ended,
            publish=self.publish,
            positions=positions,
        )


class JoinService(ShellWorker):
    """The approval-join's handler and timer on the runtime's consumer loop, in the shell."""

    service = "approval-join"
    retry_on = DEPENDENCY_ERRORS

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        feed: PolicyFeed,
        *,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        tracer: Tracer | None = None,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._feed = feed
        self.health = Health.of("approval-join", settings)
        self.stopping = asyncio.Event()
        self._crash_points = crash_points
        self._tracer = tracer or tracer_from(settings, service="streams")
        self._freezes = FleetFreezes(settings)
        self._resources = StreamStorage(database_conninfo(settings), max_size=2)
        self._sources = SourceReader(settings)
        self._join = ApprovalJoin(
            settings,
            catalog=catalog,
            feed=feed,
            fetch=self._resources.fetch,
            limits=limits_from(settings),
            freezes=self._freezes,
        )
        self._kinds = {settings.topic(t): t for t in SOURCES}
        self._kafka = KafkaClients(
            settings, *self._kinds, group=settings.group(APPROVAL_JOIN_GROUP)
        )
        self._pool: AsyncConnectionPool[Any] | None = None
        self._store: JoinStore | None = None
        # Outbox rows taken and being published (cleared once acknowledged), and whether
        # they were a dead worker's.
        self._taken: list[tuple[Taken, bool]] = []
        self._due_next = 0.0
        self._orphans_next = 0.0
        self._failures = 0
        self._owned: frozenset[tuple[str, int]] | None = None
        # Set once this worker owns partitions (the log says "approval-join ready").
        self.owning = asyncio.Event()
        self.loop: ConsumerLoop | None = None

    # -- storage ---------------------------------------------------------------------------

    async def _connect(self) -> JoinStore:
        if self._store is None:
            pool = await open_pool(
                # Not checked at every checkout (a round trip per transaction): a connection
                # that died fails its transaction, and the pool is dropped and made anew.
                pg_pool(
                    database_conninfo(self._settings),
                    max_size=4,
                    dict_rows=True,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    check=False,
                ),
                wait_seconds=CONNECT_TIMEOUT_SECONDS,
            )
            self._pool = pool
            self._store = JoinStore(pool, deployment=self._settings.topic_prefix)
        return self._store

    async def _drop_pool(self) -> None:
        await self._abandon()
        if self._pool is not None:
            await self._pool.close(timeout=1.0)
        self._pool = self._store = None

    async def _abandon(self) -> None:
        taken, self._taken = self._taken, []
        for rows, _orphans in taken:
            await rows.abandon()

    async def _guarded(self, step: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``step``; the database away drops the pool (the loop retries the step) and
        makes the service not ready until a step passes again."""
        try:
            result = await step()
        except (psycopg.Error, PoolTimeout, StorageUnavailable) as exc:
            self._failures += 1
            self.health.waiting_for(f"database: {type(exc).__name__}")
            log.warning("approval-join: database unavailable (%s)", exc)
            await self._drop_pool()
            raise StorageUnavailable() from exc
        if self._failures:
            log.info("approval-join: database back after %d failed tries", self._failures)
            self._failures = 0
            self.health.running()
        return result

    # -- a batch -----------------------------------------------------------------------------

    async def _handle(self, records: Sequence[Consumed]) -> list[Handled]:
        return list(await self._guarded(lambda: self._apply(records)))

    async def _apply(self, records: Sequence[Consumed]) -> list[Handled]:
        """One batch in one transaction (the module docstring); per record, what the loop
        publishes for it."""
        writes = _Writes(started=time.time_ns(), now=datetime.now(UTC))
        store = await self._connect()
        await self._abandon()  # nothing is still held here; were it, it goes back
        results: list[Handled] = [Handled(observe=False)] * len(records)
        kinds = [self._kinds[r.topic] for r in records]
        owned: list[tuple[int, int, int]] = []  # (record, first, end) in ``writes.publish``
        async with store.transaction() as tx:
            # The batch's partitions and calls locked, and read, in one round trip (a
            # redelivered record's call is locked too: harmless).
            applied, stored = await tx.lock(
                [(k.value, r.partition) for k, r in zip(kinds, records, strict=True)],
                [r.key.decode(errors="replace") for r in records if r.key],
            )
            fresh = [
                n
                for n, (kind, r) in enumerate(zip(kinds, records, strict=True))
                if r.offset >= applied.get((kind.value, r.partition), 0)
            ]
            states = await self._restored(stored, tx.sources)
            before = dict(states)
            known = self._known(tx.sources, records, fresh)
            positions: dict[tuple[str, int], int] = {}
            for n in fresh:
                record, kind = records[n], kinds[n]
                spot = (kind.value, record.partition)
                positions[spot] = max(positions.get(spot, 0), record.offset + 1)
                first = len(writes.publish)
                handled = await self._one(record, kind, states, writes)
                if handled is not None:
                    results[n] = handled
                    owned.append((n, first, len(writes.publish)))
            self._crash_points.reached(CrashPoint.JOIN_DECIDED)
            ids = await tx.write(
                writes.changes(
                    states, before, catalog=self._catalog, known=known, positions=positions
                )
            )
            self._crash_points.reached(CrashPoint.JOIN_WRITTEN)
        self._crash_points.reached(CrashPoint.JOIN_COMMITTED)
        taken = await store.take(ids)
        self._taken.append((taken, False))
        self._crash_points.reached(CrashPoint.JOIN_TAKEN)
        mine = set(taken.ids)
        publish = writes.publish
        for n, first, end in owned:
            emits = tuple(publish[i].emit for i in range(first, end) if ids[i] in mine)
            results[n] = replace(results[n], emits=emits)
        return results

    async def _one(
        self,
        record: Consumed,
        kind: Topic,
        states: dict[str, ApprovalState | None],
        writes: _Writes,
    ) -> Handled | None:
        """One record's effect, added to ``writes`` (and ``states``); what the loop is told
        of it (None: nothing, a call the authorizer committed)."""
        position = position_of(record)
        parent = traceparent_of(record.headers)
        call_id = record.key.decode(errors="replace") if record.key else None
        state = states.get(call_id) if call_id is not None else None
        try:
            joined = await self._join.on_record(
                kind, record.key, record.value, position, state, now=writes.now
            )
        except ValueError:  # pydantic's ValidationError is one
            letter = dead_letter(
                record.value,
                reason="approval-join: unreadable record",
                call_id=None,
                source=position,
                at=writes.now,
                key=text_key(record.key),
            )
            hop = record_emits_hop(
                self._tracer,
                Stage.APPROVE,
                (letter,),
                parent=parent,
                start_ns=writes.started,
                end_ns=time.time_ns(),
            )
            writes.publish.append(Publish(emit=letter, call_id=None, traceparent=hop))
            return Handled(traceparent=hop)
        if joined is None:
            return None  # committed by the authorizer, whose hop the call's trace went through
        after, hop = self._traced(joined, parent, writes.started)
        if call_id is not None:
            states[call_id] = after
        event = f"{record.topic}:{record.partition}:{record.offset}"
        writes.add(joined, event=event, hop=hop, call_id=call_id)
        return _answered(after, call_id, hop)

    async def _restore(
        self, state: ApprovalState | None, sources: dict[str, Sources]
    ) -> ApprovalState | None:
        """A stored state with its calls' secret arguments read back (streams/join_secrets.py)."""
        if state is None or not secret_calls(state, self._catalog):
            return state
        return await self._sources.restore(state, sources.get(state.call_id, {}), self._catalog)

    async def _restored(
        self, states: dict[str, ApprovalState | None], sources: dict[str, Sources]
    ) -> dict[str, ApprovalState | None]:
        return {c: await self._restore(s, sources) for c, s in states.items()}

    @staticmethod
    def _known(
        stored: dict[str, Sources], records: Sequence[Consumed], fresh: Sequence[int]
    ) -> dict[str, Source]:
        """Where each call's arguments are: as stored, and the `calls.authorized` records of
        this batch."""
        known = {c: where for sources in stored.values() for c, where in sources.items()}
        for n in fresh:
            record = records[n]
            call_id = call_id_in(record.value)
            if call_id is not None and record.topic.endswith(Topic.AUTHORIZED.value):
                known[call_id] = Source(
                    topic=record.topic, partition=record.partition, offset=record.offset
                )
        return known

    def _traced(
        self, joined: Joined, parent: Any, started: int
    ) -> tuple[ApprovalState | None, bytes]:
        """The join's hop for ``joined`` (its metric and span) and the state to keep: a call's
        trace continues from the hop that asked for its approval (a decision or the timer
        comes in a trace of its own, or none), which the state remembers."""
        state = joined.state
        emits = tuple(e for s in joined.steps for e in s.emits)
        call = state.authorized if state is not None else None
        trace_id = call.trace_id if call is not None else None
        stored = state.traceparent if state is not None else None
        if trace_id and stored and (parent is None or parent.trace_id != trace_id):
            parent = parse_traceparent(stored)
        hop = record_emits_hop(
            self._tracer,
            Stage.APPROVE,
            emits,
            parent=parent,
            start_ns=started,
            end_ns=time.time_ns(),
            trace_id=trace_id,
        )
        if state is not None and call is not None and stored is None:
            state = state.model_copy(update={"traceparent": hop.decode()})
        return state, hop

    # -- the timer and the dead workers' records ----------------------------------------------

    async def _tick(self) -> list[Handled]:
        return list(await self._guarded(self._turn))

    def _note_assignment(self) -> None:
        """Say which partitions this worker owns whenever that changes (a rebalance)."""
        consumer = self._kafka.consumer
        if consumer is None:
            return
        owned = frozenset((tp.topic, tp.partition) for tp in consumer.assignment())
        if owned == self._owned:
            return
        self._owned = owned
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(owned):
            by_topic.setdefault(topic, []).append(partition)
        log.info(
            "approval-join owns %d partitions: %s",
            len(owned),
            "; ".join(f"{t} {p}" for t, p in by_topic.items()) or "none",
        )
        if owned and not self.owning.is_set():
            self.owning.set()
            log.info("approval-join ready")

    async def _turn(self) -> list[Handled]:
        """After each poll: states now due (every ``TICK_SECONDS``) and the records a dead
        worker left in the outbox (every ``ORPHANS_EVERY_SECONDS``)."""
        self._note_assignment()
        clock = time.monotonic()
        handled: list[Handled] = []
        if clock >= self._due_next:
            self._due_next = clock + TICK_SECONDS
            handled += await self._expire()
        if clock >= self._orphans_next:
            self._orphans_next = clock + ORPHANS_EVERY_SECONDS
            handled += await self._orphans()
        return handled

    async def _expire(self) -> list[Handled]:
        store = await self._connect()
        now = datetime.now(UTC)
        due = await store.due(now, limit=DUE_PER_TICK)
        if not due:
            return []
        writes = _Writes(started=time.time_ns(), now=now)
        owned: list[tuple[str, int, int, ApprovalState | None]] = []
        async with store.transaction() as tx:
            stored = await tx.lock_calls(due)
            states: dict[str, ApprovalState | None] = {}
            for call_id, state in stored.items():
                try:
                    states[call_id] = await self._restore(state, tx.sources)
                except SecretsUnavailable as exc:
                    log.error("approval-join: %s; %s waits", exc, call_id)
            before = dict(states)
            known = self._known(tx.sources, (), ())
            for call_id in due:
                if call_id not in states:
                    continue
                state = states.get(call_id)
                if state is not None and not is_due(state, now):
                    continue  # another worker's turn came first
                joined = self._join.on_due(state, now=now)
                parent = parse_traceparent(state.traceparent) if state is not None else None
                after, hop = self._traced(joined, parent, writes.started)
                states[call_id] = after
                moment = due_at(state) if state is not None else None
                event = f"{store.deployment}timer:{call_id}:{moment.isoformat() if moment else '-'}"
                first = len(writes.publish)
                writes.add(joined, event=event, hop=hop, call_id=call_id)
                owned.append((call_id, first, len(writes.publish), state))
            ids = await tx.write(writes.changes(states, before, catalog=self._catalog, known=known))
        taken = await store.take(ids)
        self._taken.append((taken, False))
        mine = set(taken.ids)
        publish = writes.publish
        results = []
        for call_id, first, end, state in owned:
            emits = tuple(publish[i].emit for i in range(first, end) if ids[i] in mine)
            if emits:
                answered = _answered(state, call_id, publish[first].traceparent)
                results.append(replace(answered, emits=emits))
        return results

    async def _orphans(self) -> list[Handled]:
        store = await self._connect()
        taken, orphans = await store.orphans(age_seconds=ORPHAN_AGE_SECONDS, limit=ORPHANS_PER_TURN)
        if not orphans:
            return []
        self._taken.append((taken, True))
        log.info("approval-join: publishing %d records a stopped worker left", len(orphans))
        self._crash_points.reached(CrashPoint.JOIN_ORPHANS_TAKEN)
        return [
            Handled(
                emits=(o.emit,),
                traceparent=o.traceparent,
                observe=o.traceparent is not None,
                call_id=o.call_id,
            )
            for o in orphans
        ]

    async def _published(self) -> None:
        """Everything handed to the loop is acknowledged: clear the outbox rows taken."""
        taken, self._taken = self._taken, []
        if not taken:
            return
        self._crash_points.reached(
            CrashPoint.JOIN_ORPHANS_PUBLISHED
            if any(orphans for _rows, orphans in taken)
            else CrashPoint.JOIN_PUBLISHED
        )
        try:
            for rows, _orphans in taken:
                await rows.clear()
        except StorageUnavailable:
            log.warning("approval-join: outbox not cleared; its records go out again")
            for rows, _orphans in taken:
                await rows.abandon()
            await self._drop_pool()
            return
        self._crash_points.reached(CrashPoint.JOIN_CLEARED)

    # -- the shell ------------------------------------------------------------------------------

    def wire(self, shell: ServiceShell) -> None:
        shell.on_startup.append(StartupHook(name="policy feed", run=self._feed.catch_up))
        shell.on_startup.append(StartupHook(name="controls", run=self._freezes.catch_up))
        shell.on_startup.append(StartupHook(name="broker", run=self._kafka.start))
        shell.on_startup.append(StartupHook(name="database", run=self._connect))
        shell.side_tasks.append(SideTask(name="policy feed", run=self._feed.follow))
        shell.side_tasks.append(SideTask(name="freezes", run=self._follow_freezes))
        shell.on_shutdown.append(self._stop_tracer)
        shell.on_shutdown.append(self._close_clients)

    async def _follow_freezes(self) -> None:
        await self._freezes.follow()

    async def _stop_tracer(self) -> None:
        self._tracer.shutdown()

    async def _close_clients(self) -> None:
        await self._drop_pool()
        await self._resources.close()
        await self._sources.close()
        await self._kafka.stop()
        await self._freezes.close()

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: the consumer loop until ``stop`` is set."""
        settings = self._settings
        assert self._kafka.consumer is not None
        self.loop = consumer_loop(
            settings,
            self._kafka.consumer,
            self._kafka.producer,
            stage=Stage.APPROVE,
            group=settings.group(APPROVAL_JOIN_GROUP),
            handle=self._handle,
            tracer=self._tracer,
            answers=Stage.APPROVE,
            retry_on=DEPENDENCY_ERRORS,
            after_publish=self._published,
            tick=self._tick,
            poll_ms=POLL_MS,
            max_records=MAX_RECORDS,
            health=self.health,
            batched_sends=True,
        )
        log.info(
            "approval-join started on %s",
            ", ".join(settings.topic(t) for t in SOURCES),
        )
        await run_until(self.loop, stop)


def _answered(state: ApprovalState | None, call_id: str | None, hop: bytes | None) -> Handled:
    """What the loop is told of a call's record: its hop, and who to answer should its
    output be refused."""
    call = state.authorized if state is not None else None
    return Handled(
        traceparent=hop,
        call_id=call_id,
        tool=call.tool if call is not None else "",
        tenant=call.tenant if call is not None else None,
        reply_to=call.reply_to if call is not None else None,
    )


async def run_approval_join(
    settings: Settings,
    catalog: Catalog,
    feed: PolicyFeed,
    *,
    prepare: Callable[[], Awaitable[None]] | None = None,
    crash_points: CrashPoints = NO_CRASH_POINTS,
) -> int:
    """Run `ratifier approval-join` in the service shell until SIGTERM / SIGINT; the exit
    code."""
    service = JoinService(settings, catalog, feed, crash_points=crash_points)
    shell = service.shell(prepare, http_port=settings.streams.http_port, handle_signals=True)
    return await shell.run(service.consume)
