"""`ratifier executor`: a consumer group on `commands.committed`, the executor's handler on
the runtime's consumer loop.

Offsets are committed only after each outcome is recorded in the ledger and acknowledged by
the broker. Records of one operation run in order, different operations concurrently. On
SIGTERM the current batch is finished and its offsets committed; nothing unfinished is
committed. A record that cannot be read, or whose handling fails, is dead-lettered (with a
typed outcome when its call id can be read) without affecting the others. The plain reads of
a batch run together, in one transaction (executors/reads.py); if that fails for a reason
other than storage, they are run one by one like the rest. The writes take their Redis claims
in one round trip, are group-committed per partition (CommandExecutor.execute_group) and
finish their claims in one round trip (docs/execution.md, "Claims" and "Group commit").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from approvals.signing import approval_keys
from commands.catalog import Catalog
from config.settings import Settings
from executors.breakers import fleet_breakers
from executors.cancellations import CancelledCalls
from executors.claims import Claim, ClaimFinish, ClaimKind, ClaimStore
from executors.crash_points import NO_CRASH_POINTS, CrashPoint, CrashPoints
from executors.executor import CommandExecutor, Execution, GroupMember
from executors.reads import BatchedReads, Read, split_reads
from feeds.freezes import FleetFreezes
from feeds.policies import PolicyFeed
from runtime.clients import (
    database_conninfo,
    kafka_consumer,
    kafka_producer,
    pg_pool,
    redis_client,
    start_kafka_client,
)
from runtime.emit import Emit
from runtime.health import Health
from runtime.heap import settle_heap
from runtime.load import report_waiting
from runtime.loop import ConsumerLoop, Handled, by_key, consumer_loop
from runtime.retry import Stopped, retrying
from runtime.shell import ServiceShell, StartupHook, run_until
from runtime.startup import DEPENDENCY_ERRORS, open_pool
from runtime.supervision import SideTask
from schemas.envelopes import CommittedCommand, Outcome, Stage
from schemas.errors import StorageUnavailable
from schemas.names import EXECUTOR_GROUP, Topic
from telemetry.tracing import new_trace_id, traceparent_of, tracer_from

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("ratifier.executor")

POOL_SIZE = 8
# How long a stop waits for the current batch (group commits, outcomes acknowledged).
STOP_GRACE_SECONDS = 15.0

# The claims a command may run under in a group: its own, or none to be had (Redis away or
# the fast path off: the ledger decides alone). Busy, done and conflict are answered alone.
_RUNNABLE = frozenset({ClaimKind.CLAIMED, ClaimKind.EXPIRED, ClaimKind.UNAVAILABLE})
_NO_CLAIM = Claim(kind=ClaimKind.UNAVAILABLE)

# Records of one tenant's lane handled as one batch at most: a burst is handled in slices
# this small, between which another tenant's commands run (docs/operations.md); the other
# tenants' lanes run meanwhile, and a slice gives way to their few records at its yield points.
# 200 (a poll batch), not 50: slices of 50 of one tenant's reads held a closed loop of reads
# at 2,290-2,599 calls/s and 456-463 us of CPU per call, 200 at 3,408-3,719 and 322-350 us
# (docs/measurements.md, "Lanes with few records together").
LANE_RECORDS = 200
# Records of one partition the executor reads ahead before pausing it: another tenant's
# command behind one tenant's admitted backlog on the same partition is read past it and
# started in its own lane (the executor's records are small; its poll batch is 200).
READ_AHEAD = 2000
# A record's place: (topic, partition, offset).
Position = tuple[str, int, int]


# Members per group commit. Measured (T3 drains, 2 cores): one group per partition batch ran
# its members' round trips one after another and drained writes at half the rate of one
# transaction per command; groups of 8, concurrently, drain them as fast as that, within the
# machine's noise (docs/execution.md, "Group commit").
GROUP_SIZE = 8


def tenant_lane(record: ConsumerRecord[bytes, bytes]) -> bytes:
    """A committed command's lane: its tenant, the key's part before ``:`` (the key is the
    operation id, tenant + ``:`` + idempotency key, so an operation's records share a lane)."""
    return (record.key or b"").split(b":", 1)[0]


def _chunks(positions: list[int]) -> list[list[int]]:
    return [positions[i : i + GROUP_SIZE] for i in range(0, len(positions), GROUP_SIZE)]


def _lock_order(command: CommittedCommand | None) -> tuple[str, str]:
    if command is None:
        return ("", "")
    return (command.tool, json.dumps(command.arguments, sort_keys=True, default=str))


def _position(record: ConsumerRecord[bytes, bytes]) -> Position:
    return (record.topic, record.partition, record.offset)


@dataclass(frozen=True, kw_only=True)
class _Parts:
    """What an executor process built at start-up (its clients and views)."""

    owner: str
    consumer: AIOKafkaConsumer
    producer: AIOKafkaProducer
    pool: AsyncConnectionPool[Any]
    redis: Redis
    claims: ClaimStore
    cancelled: CancelledCalls
    freezes: FleetFreezes


class ExecutorService:
    """The executor's handler on the runtime's consumer loop (runtime/loop.py)."""

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog,
        policies: PolicyFeed,
        health: Health | None = None,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> None:
        self._settings = settings
        self.health = health or Health.of("executor", settings)
        self._catalog = catalog
        self._policies = policies
        self._stopping = asyncio.Event()
        self._crash_points = crash_points
        self._tracer = tracer_from(settings, service="executor")
        self._loop: ConsumerLoop | None = None
        self._built: _Parts | None = None
        self._cancellations_ready = asyncio.Event()
        self._freezes_ready = asyncio.Event()
        # Commands in flight at once in this process (the pool has POOL_SIZE connections).
        # Records of one key (operation id) run in order; different keys of a partition run
        # concurrently: one at a time, a partition's throughput was one command per ledger
        # round-trip chain (~10 round trips and a commit), whatever PostgreSQL could do.
        self._concurrency = asyncio.Semaphore(POOL_SIZE * 2)

    @property
    def processed(self) -> int:
        return self._loop.processed if self._loop is not None else 0

    @property
    def stopping(self) -> asyncio.Event:
        return self._stopping

    def stop(self) -> None:
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()

    @staticmethod
    def _parsed(record: ConsumerRecord[bytes, bytes]) -> tuple[CommittedCommand | None, str]:
        """The record's command (None: unreadable) and the trace it is answered in."""
        parent = traceparent_of(record.headers)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        try:
            return CommittedCommand.model_validate_json(record.value or b""), trace_id
        except ValidationError:
            return None, trace_id

    async def _execute(
        self,
        executor: CommandExecutor,
        pool: AsyncConnectionPool[Any],
        record: ConsumerRecord[bytes, bytes],
        *,
        ahead: dict[Position, Claim] | None = None,
        finishes: list[ClaimFinish] | None = None,
    ) -> Handled:
        """One command. ``ahead``: claims taken for the batch in one round trip, by record
        position, each used once (a retry claims again); ``finishes``: where the claims this
        leaves to finish go (the batch finishes them together), else they finish here."""
        command, trace_id = self._parsed(record)
        if command is None:
            return Handled(failure="unreadable committed command", trace_id=trace_id)
        claims = ahead if ahead is not None else {}

        async def attempt() -> Execution:
            return await executor.execute(
                command,
                trace_id=trace_id,
                claim=claims.pop(_position(record), None),
                defer_finish=finishes is not None,
            )

        # Storage away: nothing happened (the transaction rolled back), so waiting is safe
        # and skipping would lose the command. Connections that died while idle are all
        # suspect: the pool drops them at once before the first retry.
        done = await retrying(
            attempt,
            retry_on=(StorageUnavailable,),
            what=f"ledger (operation {command.operation_id})",
            stop=self._stopping,
            first_retry=pool.check,
        )
        if done.claim_finish is not None and finishes is not None:
            finishes.append(done.claim_finish)
        return self._handled(command, trace_id, done)

    @staticmethod
    def _handled(command: CommittedCommand, trace_id: str | None, done: Execution) -> Handled:
        """What one executed command publishes: its outcome (and the command to
        reconciliation when the outcome is unknown)."""
        outcome: Outcome = done.outcome
        if outcome.trace_id != trace_id or outcome.reply_to != command.reply_to:
            # A stored outcome answering a repeated call is published in that call's trace,
            # and to that call's reply address.
            outcome = outcome.model_copy(
                update={"trace_id": trace_id, "reply_to": command.reply_to}
            )
        emits = [Emit(topic=Topic.OUTCOMES, key=outcome.call_id, value=outcome)]
        if done.unknown:
            emits.append(Emit(topic=Topic.UNKNOWN, key=command.operation_id, value=command))
        return Handled(
            emits=tuple(emits),
            trace_id=trace_id,
            call_id=outcome.call_id,
            tool=outcome.tool,
            tenant=outcome.tenant,
            reply_to=command.reply_to,
        )

    async def _handle_batch(
        self,
        records: Sequence[ConsumerRecord[bytes, bytes]],
        *,
        executor: CommandExecutor,
        reads: BatchedReads,
        pool: AsyncConnectionPool[Any],
    ) -> list[Handled]:
        """A poll batch: its plain reads together (one transaction), concurrently with the
        rest, record by record in order per key. The writes' Redis claims are taken in one
        round trip before, and finished in one after (docs/execution.md, "Claims")."""
        parsed = [self._parsed(record) for record in records]
        read_at, rest_at = split_reads([command for command, _ in parsed], self._catalog)
        results: list[Handled | None] = [None] * len(records)

        async def one_by_one(at: list[int]) -> None:
            ahead = await self._claims_ahead(executor, [records[i] for i in at], parsed, at)
            finishes: list[ClaimFinish] = []
            execute = partial(self._execute, executor, pool, ahead=ahead, finishes=finishes)
            try:
                alone = at
                if self._settings.executor.group_commit:
                    alone = await self._group_commit(
                        executor,
                        records=records,
                        parsed=parsed,
                        at=at,
                        ahead=ahead,
                        finishes=finishes,
                        results=results,
                    )
                # Records of one key in order: a group holds only the first of each
                # operation, and what is left runs after the groups.
                handled = await by_key(
                    [records[i] for i in alone], execute, concurrency=self._concurrency
                )
            finally:
                # Also on a stop: what was recorded in the ledger gets its fast path.
                await executor.finish_many(finishes)
            for i, result in zip(alone, handled, strict=True):
                results[i] = result

        async def together(at: list[int]) -> None:
            batch = [
                Read(command=command, trace_id=trace_id)
                for command, trace_id in (parsed[i] for i in at)
                if command is not None
            ]
            try:
                async with self._concurrency:
                    done = await retrying(
                        partial(reads.execute, batch),
                        retry_on=(StorageUnavailable,),
                        what=f"reads ({len(batch)} in one transaction)",
                        stop=self._stopping,
                        first_retry=pool.check,
                    )
            except Stopped:
                raise
            except Exception:
                # A bug, or a handler's database error that aborted the shared transaction
                # (nothing was committed): each read alone, isolated like any record.
                log.exception("batched reads failed; running %d reads one by one", len(batch))
                await one_by_one(at)
                return
            for i, read, execution in zip(at, batch, done, strict=True):
                results[i] = self._handled(read.command, read.trace_id, execution)

        await asyncio.gather(
            *([together(read_at)] if read_at else []),
            *([one_by_one(rest_at)] if rest_at else []),
        )
        return [r if r is not None else Handled(failure="internal error") for r in results]

    async def _group_commit(
        self,
        executor: CommandExecutor,
        *,
        records: Sequence[ConsumerRecord[bytes, bytes]],
        parsed: Sequence[tuple[CommittedCommand | None, str]],
        at: Sequence[int],
        ahead: dict[Position, Claim],
        finishes: list[ClaimFinish],
        results: list[Handled | None],
    ) -> list[int]:
        """Group-commit the writes of each partition batch (``CommandExecutor.execute_group``,
        docs/execution.md "Group commit"): the first command of each operation whose claim
        lets it run, two or more per partition, in groups of up to ``GROUP_SIZE`` that run
        concurrently.
        Fills ``results`` for what the groups answered; returns the positions left to run
        one by one, in batch order."""
        groups: dict[tuple[str, int], list[int]] = {}
        seen: set[str] = set()
        for i in at:
            command = parsed[i][0]
            if command is None or command.operation_id in seen:
                continue
            seen.add(command.operation_id)
            claim = ahead.get(_position(records[i]), _NO_CLAIM)
            if claim.kind in _RUNNABLE:
                groups.setdefault((records[i].topic, records[i].partition), []).append(i)
        # Members in one order across groups (tool, then arguments): concurrent groups then
        # lock the rows they share in the same order, so they may wait but not deadlock.
        grouped = [
            chunk
            for members in groups.values()
            if len(members) > 1
            for chunk in _chunks(sorted(members, key=lambda i: _lock_order(parsed[i][0])))
        ]
        if not grouped:
            return list(at)
        answered: set[int] = set()

        async def run(positions: list[int]) -> None:
            members = []
            for i in positions:
                command, trace_id = parsed[i]
                assert command is not None
                claim = ahead.pop(_position(records[i]), _NO_CLAIM)
                members.append(GroupMember(command=command, trace_id=trace_id, claim=claim))
            async with self._concurrency:
                try:
                    done = await executor.execute_group(members)
                except StorageUnavailable as exc:
                    # Nothing of the failed transaction is committed: each member runs alone,
                    # with the storage retries of one command.
                    log.warning(
                        "ledger unavailable for a group of %d (%r); alone",
                        len(members),
                        exc.__cause__,
                    )
                    done = [None] * len(members)
            for i, member, execution in zip(positions, members, done, strict=True):
                if execution is None:
                    # Alone, after the groups, under the same claim.
                    ahead[_position(records[i])] = member.claim
                    continue
                finish = executor.finish_of(member.command, member.claim, execution)
                if finish is not None:
                    finishes.append(finish)
                results[i] = self._handled(member.command, member.trace_id, execution)
                answered.add(i)

        await asyncio.gather(*(run(positions) for positions in grouped))
        return [i for i in at if i not in answered]

    @staticmethod
    async def _claims_ahead(
        executor: CommandExecutor,
        records: Sequence[ConsumerRecord[bytes, bytes]],
        parsed: Sequence[tuple[CommittedCommand | None, str]],
        at: Sequence[int],
    ) -> dict[Position, Claim]:
        """The claims of the first command of each operation among ``records`` (positions
        ``at`` of the batch), by offset, in one round trip. A later command of the same
        operation runs after the first and claims then."""
        first: dict[str, tuple[Position, CommittedCommand]] = {}
        for record, i in zip(records, at, strict=True):
            command = parsed[i][0]
            if command is not None and executor.needs_claim(command):
                first.setdefault(command.operation_id, (_position(record), command))
        if not first:
            return {}
        positions = [position for position, _ in first.values()]
        claims = await executor.claim_many([command for _, command in first.values()])
        return dict(zip(positions, claims, strict=True))

    async def _keep_alive(self) -> None:
        """Refresh this executor's liveness mark, so that when it dies its claims are taken
        over within ``liveness_ms`` instead of after their lease."""
        claims = self._parts().claims
        while not self._stopping.is_set():
            await claims.heartbeat()
            await asyncio.sleep(claims.liveness_ms / 5000)

    async def _until_ready(self, *views_ready: asyncio.Event) -> None:
        """Wait until the cancellation and freeze views have caught up (60 s at most), or
        until a stop (a follower that died on the way asked for one)."""

        async def all_ready() -> None:
            for event in views_ready:
                await event.wait()

        ready = asyncio.create_task(all_ready())
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({ready, stop}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            stop.cancel()
        caught_up = all(event.is_set() for event in views_ready)
        if not caught_up and not self._stopping.is_set():
            raise TimeoutError("the cancellation and freeze views did not catch up within 60 s")

    def wire(self, shell: ServiceShell) -> None:
        """The executor's start-up, side tasks and closing in the shell (one start-up policy
        for every service): its clients are built, the tool hooks started, the database and
        the broker waited for (retried, alive but not ready meanwhile); the views it decides
        on follow their topics as side tasks. A follower that dies stops the executor
        (non-zero exit: a fresh process rebuilds every view from its topic); the keep-alive
        is restarted, as Redis away for a while only delays take-overs."""
        shell.on_startup.append(StartupHook(name="tool hooks", run=self._start_catalog))
        shell.on_startup.append(StartupHook(name="database and broker", run=self._connect))
        shell.side_tasks.extend(
            [
                SideTask(name="policy follower", run=self._follow_policies),
                SideTask(name="cancellation follower", run=self._follow_cancellations),
                SideTask(name="freeze follower", run=self._follow_freezes),
                SideTask(name="keep-alive", run=self._keep_alive, restartable=True),
            ]
        )
        if self._settings.admission.fair_target_seconds > 0:
            shell.side_tasks.append(
                SideTask(name="queueing delay", run=self._report_waiting, restartable=True)
            )
        shell.on_shutdown.append(self._close)

    def _parts(self) -> _Parts:
        assert self._built is not None, "the executor's clients are built at start-up"
        return self._built

    async def _connect(self) -> None:
        """Build the clients and views, open the pool and start the producer; on a failure
        close what was built (a closed pool or a client that failed to start cannot be
        started again) and raise it for the shell to retry with new ones."""
        parts = self._build()
        try:
            await open_pool(parts.pool, wait_seconds=30)
            await start_kafka_client(parts.producer, self._settings.kafka)
        except BaseException:
            self._built, self._loop = None, None
            await parts.pool.close(timeout=1.0)
            await parts.redis.aclose()
            raise

    def _build(self) -> _Parts:
        """Every client and view (nothing connects yet)."""
        settings = self._settings
        group = settings.group(EXECUTOR_GROUP)
        consumer = kafka_consumer(
            settings, settings.topic(Topic.COMMITTED), group=group, max_poll_records=200
        )
        producer = kafka_producer(settings)
        # Every connection opened at start, not under the first burst of commands (each one's
        # authentication costs milliseconds of CPU, in this process and in PostgreSQL's).
        pool = pg_pool(
            database_conninfo(settings), max_size=POOL_SIZE, min_size=POOL_SIZE, dict_rows=True
        )
        redis = redis_client(settings)
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        claims = ClaimStore(
            redis,
            prefix=settings.topic_prefix,
            owner=owner,
            lease_ms=settings.executor.claim_lease_seconds * 1000,
        )
        cancelled = CancelledCalls(settings)
        freezes = FleetFreezes(settings)  # the kill switch, checked at commit time
        receipt_keys = approval_keys(settings)
        breakers = fleet_breakers(settings, self._catalog, redis, producer, by=owner)
        executor = CommandExecutor(
            breakers=breakers,
            pool=pool,
            claims=claims if settings.executor.redis_fast_path else None,
            catalog=self._catalog,
            policies=self._policies,
            cancelled=cancelled,
            retry_attempts=settings.executor.retry_attempts,
            crash_points=self._crash_points,
            wait_for_owner_seconds=settings.executor.claim_lease_seconds,
            receipt_keys=receipt_keys,
            freezes=freezes,
        )
        reads = BatchedReads(
            pool=pool,
            catalog=self._catalog,
            policies=self._policies,
            receipt_keys=receipt_keys,
            cancelled=cancelled,
            freezes=freezes,
            breakers=breakers,
        )
        handle = partial(self._handle_batch, executor=executor, reads=reads, pool=pool)
        self._loop = consumer_loop(
            settings,
            consumer,
            producer,
            stage=Stage.EXECUTE,
            group=group,
            handle=handle,
            tracer=self._tracer,
            answers=Stage.EXECUTE,
            # Offsets move only after every outcome is acknowledged (crash tests kill here).
            before_commit=lambda: self._crash_points.reached(CrashPoint.AFTER_PUBLISH),
            health=self.health,
            # One tenant's admitted burst in a poll batch does not hold another's records
            # (docs/operations.md, "Fair admission").
            lane=tenant_lane,
            lane_records=LANE_RECORDS,
            read_ahead=READ_AHEAD,
        )
        parts = self._built = _Parts(
            owner=owner,
            consumer=consumer,
            producer=producer,
            pool=pool,
            redis=redis,
            claims=claims,
            cancelled=cancelled,
            freezes=freezes,
        )
        return parts

    async def _report_waiting(self) -> None:
        """This executor's queueing delay for the validators' fair shares (runtime/load.py)."""
        loop = self._loop
        assert loop is not None
        await report_waiting(
            self._parts().redis,
            topic_prefix=self._settings.topic_prefix,
            stage=Stage.EXECUTE.value,
            waiting=[loop.waiting_seconds],
            period=self._settings.admission.fair_tick_seconds,
            stop=self._stopping,
        )

    async def _start_catalog(self) -> None:
        await self._catalog.start(self._settings)

    async def _follow_policies(self) -> None:
        self._crash_points.reached(CrashPoint.FOLLOWER_STARTED)
        await self._policies.follow()

    async def _follow_cancellations(self) -> None:
        self._crash_points.reached(CrashPoint.FOLLOWER_STARTED)
        await self._parts().cancelled.follow(self._cancellations_ready)

    async def _follow_freezes(self) -> None:
        self._crash_points.reached(CrashPoint.FOLLOWER_STARTED)
        await self._parts().freezes.follow(self._freezes_ready)

    async def consume(self, stop: asyncio.Event) -> None:
        """The shell's main: once the cancellation and freeze views have caught up, the
        consumer loop until ``stop`` is set."""
        parts, loop = self._parts(), self._loop
        assert loop is not None
        await self._until_ready(self._cancellations_ready, self._freezes_ready)
        if self._stopping.is_set():  # a follower died before the start
            return
        await parts.claims.heartbeat()
        await parts.consumer.start()
        log.info("executor %s started on %s", parts.owner, self._settings.topic(Topic.COMMITTED))
        settle_heap("executor")  # what start-up built is not walked again
        await run_until(loop, stop)

    async def _close(self) -> None:
        """After the shell's side tasks (the followers close their own consumers): the
        clients, in the reverse order of their start."""
        log.info("executor stopping")
        parts = self._built
        if parts is not None:
            await parts.consumer.stop()
            await parts.producer.stop()
        await self._catalog.stop()
        if parts is not None:
            await parts.pool.close()
            await parts.redis.aclose()
        self._tracer.shutdown()


def run_executor(
    settings: Settings,
    *,
    catalog: Catalog,
    policies: PolicyFeed,
    prepare: Callable[[], Awaitable[object]] | None = None,
    crash_points: CrashPoints = NO_CRASH_POINTS,
) -> int:
    """Serve health and metrics at once, then ``prepare`` (topics) and catch up on the
    policies until the broker answers (alive, not ready meanwhile), then run. The exit
    status: 0 after a requested stop, 1 when a side task died (the reason is logged)."""
    service = ExecutorService(
        settings, catalog=catalog, policies=policies, crash_points=crash_points
    )

    async def start() -> None:
        if prepare is not None:
            await prepare()
        await policies.catch_up()

    shell = ServiceShell(
        service="executor",
        health=service.health,
        http_host=settings.observability.metrics_host,
        http_port=settings.observability.executor_metrics_port,
        stopping=service.stopping,
        handle_signals=True,
        # A batch's group commits finish and their outcomes are acknowledged before it exits.
        grace_seconds=STOP_GRACE_SECONDS,
        retry_on=DEPENDENCY_ERRORS,
    )
    shell.on_startup.append(StartupHook(name="kafka", run=start))
    service.wire(shell)
    return asyncio.run(shell.run(service.consume))
