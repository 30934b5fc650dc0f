"""Fair admission end to end (issues 27 and 45): tenant A floods reads while tenant B sends
one read every 250 ms (open loop); B keeps close to its unloaded latency, A's excess ends
`rate_limited` with `retry_after` within a second of publishing, every call has one final
outcome. Each tenant's calls come from a process of its own (testsupport/flood.py,
steady_agent.py); this one watches every outcome.

The four cases: A and B on partitions of their own or sharing one, and A limited to 200/s
(A then gets what its limit grants, burst + rate over the flood, ±10 %: neither more nor much
less) or no limit declared (fair shares shed A while the stages queue, and a tenant alone is
never shed); and A's tokens forged (their own buckets).

The flood is ``RATIFIER_TEST_FLOOD`` reads (default 2,000 so that `make test` stays short;
`make test-admission-flood` runs the issue's 20,000, with B's slowest call within 2x in issue
27's case, 3x in issue 45's)."""

from __future__ import annotations

import asyncio
import base64
import gc
import itertools
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import murmur2

from bench.admission import FLOOD_FIGURES
from commands.policy import DEFAULT_POLICY_DIR
from config.settings import Settings
from ratifier.topics import delete_topics
from ratifier_client.client import Pending, RatifierClient
from ratifier_client.topics import ensure_reply_topic
from runtime.clients import kafka_consumer, prompt_fetches
from schemas.envelopes import TERMINAL_STATUSES, Outcome, Status
from schemas.errors import ErrorCode
from schemas.lanes import LANE_SEPARATOR, PROPOSAL_LANES
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import context_token, read_to_end, run

pytestmark = pytest.mark.e2e

FLOOD = int(os.environ.get("RATIFIER_TEST_FLOOD", "2000"))
# B's slowest call during the flood against its slowest alone: within 2x with
# RATIFIER_TEST_FLOOD_STRICT=1 (`make test-admission-flood`, issue 27), within 3x otherwise
# (issue 45's bound). B's first call meets A's burst of 200 admitted reads, which take the
# CPU for a moment: measured on the shared 2-core machine, 0.84-1.88x with the machine
# otherwise idle (13 runs), 3.1x once with other suites running beside it. Every other bound
# is the same in both.
STRICT = os.environ.get("RATIFIER_TEST_FLOOD_STRICT") == "1"
SLOWEST_FACTOR = 2.0 if STRICT else 3.0
# Over how long A publishes its flood: the issue's 2.4 s (0: as fast as the broker takes it).
FLOOD_SECONDS = float(os.environ.get("RATIFIER_TEST_FLOOD_SECONDS", "2.4"))
RATE = 200
BURST = int(os.environ.get("RATIFIER_TEST_FLOOD_BURST", "200"))
B_EVERY = 0.25
# Tenant A's reads before the measured runs (50 over 2.4 s, well within its limit). A fresh
# pipeline is slow on its first few dozen calls in quick succession: without these, A's flood
# was them, B's call sent 250 ms into it took 95-205 ms and A's refusals up to 0.4 s; after
# 50 reads (A's, or B's: measured both) they took 25-56 ms and 0.04-0.13 s. B's 16 reads
# alone (one every 250 ms) do not warm it. Not the broker's first appends to new partitions
# (its request log: the slow appends came at offsets 34-50); what does warm is not isolated
# (docs/measurements.md, "A fresh pipeline's first flood").
WARM_A_CALLS = 50
LIMITS = f"""
# tenant-a's reads are limited to {RATE}/s; tenant-b has no limit.
[[limits]]
scope = "tenant"
tenant = "tenant-a"
rate = {RATE}
burst = {BURST}

# One call per 10 s of get_refund_policy for tenant-a (the client's retry test).
[[limits]]
scope = "tenant_tool"
tenant = "tenant-a"
tool = "get_refund_policy"
rate = 0.1
burst = 1
"""


def _started(
    signing_keys: SigningKeys,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    limited: bool,
    partitions: int | None = None,
) -> Iterator[Pipeline]:
    """A pipeline with the reference policies, and :data:`LIMITS` when ``limited``; its
    topics of ``partitions`` partitions (None: the session's 4, tenant-a and tenant-b apart)."""
    policies = tmp_path_factory.mktemp(f"{name}-policies")
    for f in DEFAULT_POLICY_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, policies / f.name)
    if limited:
        (policies / "limits.toml").write_text(LIMITS, encoding="utf-8")
    else:
        (policies / "limits.toml").unlink(missing_ok=True)
    started = start_pipeline(
        signing_keys, name, partitions=partitions, RATIFIER_POLICIES__DIRECTORY=str(policies)
    )
    try:
        settings = started.settings
        run(
            ensure_reply_topic(
                settings.kafka,
                _b_replies(settings),
                max_message_bytes=settings.limits.kafka_max_message_bytes,
            )
        )
        yield started
    finally:
        started.stop()
        run(delete_topics(started.settings))


@pytest.fixture(scope="module")
def admitting(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """Limits declared, tenant-a and tenant-b on partitions of their own."""
    yield from _started(signing_keys, tmp_path_factory, "admission", limited=True)


@pytest.fixture
def shared_limited(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """Limits declared, one partition per topic: tenant-a and tenant-b share it."""
    yield from _started(
        signing_keys, tmp_path_factory, "admission-shared", limited=True, partitions=1
    )


@pytest.fixture
def unlimited(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """No limits declared (the reference policy set), tenants apart."""
    yield from _started(signing_keys, tmp_path_factory, "admission-unlimited", limited=False)


@pytest.fixture
def shared_unlimited(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """No limits declared, one partition per topic."""
    yield from _started(
        signing_keys, tmp_path_factory, "admission-shared-unlimited", limited=False, partitions=1
    )


@dataclass
class Watch:
    """Publication and outcome times of every call (monotonic seconds)."""

    sent: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    # Each final outcome's record as it arrived, with when: validated after the run, so
    # that watching costs the machine little while the pipeline is measured.
    arrived: list[tuple[float, bytes]] = field(default_factory=list)
    # The timestamp of each record of ``arrived`` (ms), in its order; the first final
    # outcome's, per call.
    stamps: list[int] = field(default_factory=list)
    stamped: dict[str, int] = field(default_factory=dict)
    # Tenant B's calls, as B's own process timed them (testsupport/steady_agent.py): when its
    # publication was acknowledged, and when its final outcome reached B (monotonic, and
    # wall-clock ms).
    acked: dict[str, float] = field(default_factory=dict)
    replied: dict[str, float] = field(default_factory=dict)
    replied_wall_ms: dict[str, float] = field(default_factory=dict)

    def outside(self, call_ids: list[str]) -> dict[str, list[float]]:
        """Per call of B: [publication, delivery] milliseconds (its proposal's send to
        acknowledgement; its outcome's timestamp on `outcomes` to its arrival at B)."""
        return {
            call_id: [
                round((self.acked[call_id] - self.sent[call_id]) * 1000, 1),
                round(self.replied_wall_ms[call_id] - self.stamped.get(call_id, 0), 1),
            ]
            for call_id in call_ids
            if call_id in self.replied_wall_ms
        }

    def latency(self, call_id: str) -> float:
        """Publication to final outcome: as B met it (B's calls), else as the watcher saw it."""
        return self.replied.get(call_id, self.ended[call_id]) - self.sent[call_id]

    def settle(self) -> None:
        for (at, raw), stamp in zip(self.arrived, self.stamps, strict=True):
            outcome = Outcome.model_validate_json(raw)
            if outcome.terminal:
                self.outcomes.setdefault(outcome.call_id, []).append(outcome)
                self.ended.setdefault(outcome.call_id, at)
                self.stamped.setdefault(outcome.call_id, stamp)


async def _follow(
    settings: Settings, watch: Watch, stop: asyncio.Event, ready: asyncio.Event
) -> None:
    # From the end: with "earliest" (the service default), the consumer's first fetch reads
    # from the topic's start and the seek to the end below races it (a standalone check
    # showed stale records first, and delays of 0.3 to 34 s). Its fetcher wakes every 20 ms
    # (runtime/clients.py, FETCHER_WAKE_MS): with aiokafka's 200, B's first outcome of a run
    # reached this watcher ~200 ms late in about one run in three (B's "unloaded maximum" of
    # 194-199 ms; standalone: ~203 ms for 2 to 5 new consumers of 15).
    consumer = kafka_consumer(
        settings, settings.topic(Topic.OUTCOMES), group=None, auto_offset_reset="latest"
    )
    await consumer.start()
    prompt_fetches(consumer)
    try:
        await consumer.seek_to_end()
        for tp in consumer.assignment():
            await consumer.position(tp)
        ready.set()
        while not stop.is_set():
            # Every record fetched, each time: a partition's records left in the consumer
            # would hold the next fetch of every partition up to 100 ms (aiokafka's prefetch
            # backoff; runtime/clients.py, prompt_fetches), B's outcomes among them.
            batches = await consumer.getmany(timeout_ms=100)
            now = time.monotonic()
            for records in batches.values():
                watch.arrived += [(now, record.value or b"") for record in records]
                watch.stamps += [record.timestamp for record in records]
    finally:
        await consumer.stop()
    watch.settle()


@asynccontextmanager
async def _tenant_process(
    pipeline: Pipeline, module: str, *args: str | Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m module args`` with the pipeline's settings, talked to over its stdin and
    stdout (``_handshake``); killed on leaving if it still runs."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *map(str, args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **pipeline.env},
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _flood(
    pipeline: Pipeline,
    *,
    token: str,
    run_id: str,
    count: int,
    connected: asyncio.Event,
    go: asyncio.Event,
    published: asyncio.Event,
    finish: asyncio.Event,
    watch: Watch,
) -> None:
    """Tenant A's ``count`` reads from a process of their own (testsupport/flood.py), which
    sets ``connected`` once connected, publishes when ``go`` is set, sets ``published`` once
    they are acknowledged, and stops when ``finish`` is set; their publication times go into
    ``watch``."""
    out = pipeline.log_dir / f"flood-{run_id}.json"
    topic = pipeline.settings.topic(Topic.PROPOSED)
    async with _tenant_process(
        pipeline, "testsupport.flood", topic, token, run_id, str(count), str(FLOOD_SECONDS), out
    ) as process:
        await _handshake(process, says=b"ready", within=60, reached=connected, then=go, send=b"go")
        await _handshake(
            process, says=b"published", within=120, reached=published, then=finish, send=b"exit"
        )
        assert await asyncio.wait_for(process.wait(), 60) == 0
    watch.sent.update(json.loads(out.read_text(encoding="utf-8")))


async def _steady_agent(
    pipeline: Pipeline,
    *,
    token: str,
    count: int,
    ready: asyncio.Event,
    go: asyncio.Event,
    watch: Watch,
) -> list[str]:
    """Tenant B's ``count`` reads, one every :data:`B_EVERY`, from an agent process of their
    own (testsupport/steady_agent.py) reading B's reply topic: it sets ``ready`` once
    connected and starts when ``go`` is set; its call ids, once each has its final outcome
    (their times go into ``watch``)."""
    out = pipeline.log_dir / f"steady-{uuid.uuid4().hex[:8]}.json"
    replies = _b_replies(pipeline.settings)
    async with _tenant_process(
        pipeline, "testsupport.steady_agent", token, replies, str(count), str(B_EVERY), out
    ) as process:
        await _handshake(process, says=b"ready", within=60, reached=ready, then=go, send=b"go")
        assert await asyncio.wait_for(process.wait(), 120) == 0
    times = json.loads(out.read_text(encoding="utf-8"))
    for call_id, (sent, acked, replied, replied_wall_ms) in times.items():
        watch.sent[call_id], watch.acked[call_id] = sent, acked
        if replied is not None:
            watch.replied[call_id], watch.replied_wall_ms[call_id] = replied, replied_wall_ms
    return list(times)


def _b_replies(settings: Settings) -> str:
    """Tenant B's reply topic (its agent process reads its outcomes there only)."""
    return f"{settings.reply_namespace}tenant-b"


async def _handshake(
    process: asyncio.subprocess.Process,
    *,
    says: bytes,
    within: float,
    reached: asyncio.Event,
    then: asyncio.Event,
    send: bytes,
) -> None:
    """Wait (up to ``within`` seconds) for the flood's process to print ``says``, set
    ``reached``, and once ``then`` is set, send it the line ``send``."""
    assert process.stdin is not None and process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), within)
    assert line.strip() == says, line
    reached.set()
    await then.wait()
    process.stdin.write(send + b"\n")
    await process.stdin.drain()


async def _scenario(
    pipeline: Pipeline, *, flood: int, b_calls: int, forged: bool = False
) -> tuple[Watch, list[str], list[str]]:
    """Publish ``flood`` reads of tenant A at once (from a process of their own) and,
    meanwhile, ``b_calls`` reads of tenant B one every 250 ms; wait for every outcome."""
    settings = pipeline.settings
    watch, stop, ready = Watch(), asyncio.Event(), asyncio.Event()
    connected, b_ready, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    published, finish = asyncio.Event(), asyncio.Event()
    follower = asyncio.create_task(_follow(settings, watch, stop, ready))
    await ready.wait()
    token_a = context_token(settings, tenant="tenant-a")
    if forged:
        token_a = _forged(token_a)
    run_id = uuid.uuid4().hex[:8]
    a_ids = [f"flood-{run_id}-a-{i}" for i in range(flood)]
    b_ids: list[str] = []
    tenant_b = asyncio.create_task(
        _steady_agent(
            pipeline,
            token=context_token(settings, tenant="tenant-b"),
            count=b_calls,
            ready=b_ready,
            go=go,
            watch=watch,
        )
    )
    flooding = (
        asyncio.create_task(
            _flood(
                pipeline,
                token=token_a,
                run_id=run_id,
                count=flood,
                connected=connected,
                go=go,
                published=published,
                finish=finish,
                watch=watch,
            )
        )
        if flood
        else None
    )

    try:
        # Both processes are connected (each printed ``ready``) before either starts.
        if flooding is not None:
            await _until(connected, flooding)
        await _until(b_ready, tenant_b)
        go.set()
        # B's process ends once each of its calls has its final outcome.
        b_ids += await tenant_b
        if flooding is not None:
            await _until(published, flooding)
        deadline = time.monotonic() + 90
        every = set(a_ids) | set(b_ids)
        seen: set[str] = set()
        read = 0
        while not every <= seen and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            seen |= {_final_call_id(raw) for _, raw in watch.arrived[read:]}
            read = len(watch.arrived)
        await asyncio.sleep(1.0)  # a duplicate final outcome would show up meanwhile
        # The flood's process stops only now (its publication times come then).
        finish.set()
        if flooding is not None:
            await flooding
    finally:
        finish.set()
        for task in (flooding, tenant_b):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task})
        stop.set()
        await follower
    return watch, a_ids, b_ids


async def _until(event: asyncio.Event, process: asyncio.Task[Any]) -> None:
    """Wait for ``event``; the error of ``process`` (the flood's, B's) if it ends first."""
    waiting = asyncio.create_task(event.wait())
    await asyncio.wait({waiting, process}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if not event.is_set():
        await process  # it failed before: its error
        raise AssertionError("a process of the scenario ended early")


def _final_call_id(raw: bytes) -> str:
    """The call id of a final outcome ("" for any other record). orjson: the test process
    reads the flood's outcomes as they arrive, while the pipeline still handles the last of
    them, so at a quarter of json's CPU."""
    record = orjson.loads(raw)
    final = record.get("status") in {s.value for s in TERMINAL_STATUSES}
    return str(record.get("call_id")) if final else ""


def _process_cpu(pipeline: Pipeline) -> dict[str, float]:
    """CPU seconds (user + system) each pipeline process used so far, by its command (Linux;
    empty elsewhere): what a flood costs each process, whatever the neighbours on the CPU."""
    found: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    pending = [w.process.pid for w in pipeline.workers]
    while pending:
        pid = pending.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        name = next((c.decode() for c in reversed(command) if c and not c.startswith(b"-")), "?")
        found[name] = found.get(name, 0.0) + (int(stat[11]) + int(stat[12])) / ticks
        pending += [int(c) for c in children]
    return found


HOPS = (Topic.PROPOSED, Topic.VALIDATED, Topic.AUTHORIZED, Topic.COMMITTED, Topic.OUTCOMES)


def _hops(settings: Settings, call_ids: list[str]) -> dict[str, list[float]]:
    """Median and largest milliseconds ``call_ids`` spent from each topic to the next (the
    records' timestamps), and from the proposal to the outcome: where a call waited."""
    wanted = set(call_ids)
    stamps: dict[str, dict[str, int]] = {}
    for record in run(read_to_end(settings, list(HOPS))):
        try:
            call_id = json.loads(record.value or b"").get("call_id")
        except ValueError:
            continue
        if call_id in wanted:
            topic = record.topic.removeprefix(settings.topic_prefix)
            stamps.setdefault(call_id, {}).setdefault(topic, record.timestamp)
    # A read has no `calls.authorized` record (contract v1.8): the authorizer's hop ends with
    # its command (and the join's is nil, as before).
    for s in stamps.values():
        if Topic.COMMITTED.value in s:
            s.setdefault(Topic.AUTHORIZED.value, s[Topic.COMMITTED.value])
    found: dict[str, list[float]] = {}
    whole = [s for s in stamps.values() if all(h.value in s for h in HOPS)]
    if whole:
        # The slowest call's own times on each topic, in ms from its proposal.
        last = max(whole, key=lambda s: s[HOPS[-1].value] - s[HOPS[0].value])
        found["slowest"] = [last[h.value] - last[HOPS[0].value] for h in HOPS]
    for before, after in [*itertools.pairwise(HOPS), (HOPS[0], HOPS[-1])]:
        spans = [
            s[after.value] - s[before.value]
            for s in stamps.values()
            if before.value in s and after.value in s
        ]
        if spans:
            found[f"{before.value}->{after.value}"] = [statistics.median(spans), max(spans)]
    return found


def _partitions_of(settings: Settings, tenant: str) -> set[int]:
    """The `calls.proposed` partitions of ``tenant``'s lanes (keys `<tenant>#<lane>`, the
    client's default partitioner: murmur2 of the key)."""
    count = settings.topic_partitions
    keys = [f"{tenant}{LANE_SEPARATOR}{lane}".encode() for lane in range(PROPOSAL_LANES)]
    return {(murmur2(key) & 0x7FFFFFFF) % count for key in keys}


def _code(outcome: Outcome) -> ErrorCode | None:
    return outcome.error.code if outcome.error is not None else None


def _codes(watch: Watch, ids: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for call_id in ids:
        first = watch.outcomes[call_id][0]
        key = first.error.code.value if first.error else first.status.value
        found[key] = found.get(key, 0) + 1
    return found


@contextmanager
def _collections_timed() -> Iterator[list[float]]:
    """Garbage collection of this process held off within the block (what was there
    before frozen, automatic collection off; the seconds of any collection run meanwhile
    all the same are listed): this process times A's refusals,
    and its heap is the whole suite's (every module imported), so a full collection stalled
    its watcher for 107 to 153 ms (two runs; 27 to 30 ms with the heap frozen), not the
    pipeline's latency (B's calls were timed here then). Reference counting frees the
    block's garbage meanwhile; a collection at the end takes the rest."""
    pauses: list[float] = []
    started = [0.0]

    def timed(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started[0])

    gc.collect()
    gc.freeze()
    gc.disable()
    gc.callbacks.append(timed)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(timed)
        gc.enable()
        gc.unfreeze()
        gc.collect()


# Issue 45's cases: tenants sharing a partition, no limits declared (fair by default,
# streams/fair_share.py: the heaviest tenant shed while the stages queue), and a forged
# flood. Their slowest-call bound is the issue's 3x in both forms; issue 27's case (apart,
# limited) keeps its 2x when strict.
ISSUE_45_SLOWEST_FACTOR = 3.0
# A tenant alone floods this many reads with no limit declared: enough to queue the stages
# on the 2-core machine (20,000 in 2.4 s is about twice what the pipeline takes), so that a
# shedder that sheds a lone tenant is seen doing it.
LONE_FLOOD = 20_000


@dataclass(frozen=True)
class FloodCase:
    """Tenants A and B on one partition (``shared``) or apart; tenant-a limited to
    :data:`RATE` (``limited``) or no limit declared; A's tokens forged or not."""

    shared: bool
    limited: bool
    forged: bool = False


@pytest.mark.timeout(300)
def test_a_flood_of_one_tenant_leaves_another_at_its_unloaded_latency(
    admitting: Pipeline,
) -> None:
    """Separate partitions, limits declared (issue 27's case; `make bench` runs it alone and
    reads its printed figures)."""
    figures = _flood_case(admitting, FloodCase(shared=False, limited=True))
    # `make bench` reports the last run's noisy-neighbour row (bench/admission.py).
    FLOOD_FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FLOOD_FIGURES.write_text(json.dumps(figures), encoding="utf-8")
    print("admission figures:", json.dumps(figures))
    _assert_bounds(figures)


@pytest.mark.timeout(300)
def test_a_forged_flood_leaves_another_at_its_unloaded_latency(
    admitting: Pipeline,
) -> None:
    """Issue 45, "Forged floods count": A's flood carries tokens that do not verify; they draw
    from the unverified buckets of the claimed tenant (settings admission.unverified_*), the
    excess ends ``rate_limited`` at the validator, the rest ``unauthenticated``."""
    figures = _flood_case(admitting, FloodCase(shared=False, limited=True, forged=True))
    print("admission figures (forged):", json.dumps(figures))
    # Issue 45: "within the same bounds" as its other cases (2x at the median, 3x slowest).
    _assert_bounds(figures, slowest_factor=ISSUE_45_SLOWEST_FACTOR)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("fixture", "case"),
    [
        pytest.param("shared_limited", FloodCase(shared=True, limited=True)),
        pytest.param("unlimited", FloodCase(shared=False, limited=False)),
        pytest.param("shared_unlimited", FloodCase(shared=True, limited=False)),
    ],
    ids=["shared-limited", "apart-unlimited", "shared-unlimited"],
)
def test_a_flood_leaves_another_at_its_unloaded_latency_in_every_case(
    fixture: str, case: FloodCase, request: pytest.FixtureRequest
) -> None:
    """Issue 45: the other cases of the flood, tenants sharing a partition and/or no limits
    declared."""
    pipeline: Pipeline = request.getfixturevalue(fixture)
    # With no limit, a flood that does not queue the stages is not one fair shares act on:
    # these cases flood LONE_FLOOD reads in `make test` too.
    flood = FLOOD if case.limited else max(FLOOD, LONE_FLOOD)
    figures = _flood_case(pipeline, case, flood=flood)
    print(f"admission figures ({fixture}):", json.dumps(figures))
    _assert_bounds(figures, slowest_factor=ISSUE_45_SLOWEST_FACTOR)
    if not case.limited:
        # No limit: A's refusals are fair shares' (the stages queued), and B was spared.
        assert figures["a_refused"] > 0, figures


@pytest.mark.timeout(300)
def test_a_tenant_alone_may_use_all_the_capacity(unlimited: Pipeline) -> None:
    """Issue 45: with no limit declared, fair shares never shed a tenant alone, however far
    its flood queues the stages: every one of its reads succeeds."""
    watch, a_ids, _ = run(_scenario(unlimited, flood=LONE_FLOOD, b_calls=0))
    assert not [c for c in a_ids if c not in watch.outcomes]
    codes = _codes(watch, a_ids)
    assert codes == {"succeeded": LONE_FLOOD}, codes


def _forged(token: str) -> str:
    """``token`` with a well-formed signature that does not verify (its claims, tenant-a's,
    kept). Not the signature reversed: that is non-canonical base64url in about three runs of
    four, which PyJWT refuses before any verification, so those runs measured a cheaper
    forgery than the fourth (bimodal: the stages' CPU 1.5 s against 2.3 to 2.7 s)."""
    head, payload, signature = token.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    wrong = base64.urlsafe_b64encode(bytes(b ^ 0x5A for b in raw)).rstrip(b"=").decode()
    return f"{head}.{payload}.{wrong}"


def _flood_case(pipeline: Pipeline, case: FloodCase, *, flood: int = FLOOD) -> dict[str, Any]:
    """Warm the pipeline, time B alone, then B during A's flood; check that every call has
    one final outcome and how each of A's ended; the figures (with ``expected_admitted``: the
    range A's admitted calls must fall in, ``[]`` when no bound applies)."""
    settings = pipeline.settings
    lanes = {t: _partitions_of(settings, t) for t in ("tenant-a", "tenant-b")}
    # The case this test measures: A's lanes and B's on partitions of their own, or shared.
    assert bool(lanes["tenant-a"] & lanes["tenant-b"]) is case.shared, lanes
    # A fresh pipeline's first calls meet cold caches and connections, and its first few
    # dozen in quick succession are slow (WARM_A_CALLS): neither is B's unloaded latency, nor
    # a flood as a running fleet meets it. So both tenants call first.
    run(_scenario(pipeline, flood=WARM_A_CALLS, b_calls=4))
    with _collections_timed() as pauses:
        alone, _, b_alone = run(_scenario(pipeline, flood=0, b_calls=12))
        base = [alone.latency(c) for c in b_alone]
        cpu_before, load_before = _process_cpu(pipeline), os.getloadavg()[0]
        flooded, a_ids, b_ids = run(
            _scenario(pipeline, flood=flood, b_calls=12, forged=case.forged)
        )
    cpu_after, load_after = _process_cpu(pipeline), os.getloadavg()[0]
    loaded = [flooded.latency(c) for c in b_ids]
    # Every call has exactly one final outcome (repeats of the same outcome aside).
    missing = [c for c in a_ids + b_ids if c not in flooded.outcomes]
    assert not missing, f"{len(missing)} calls without a final outcome, e.g. {missing[:3]}"
    for call_id in a_ids + b_ids:
        statuses = {
            (o.status, o.error.code if o.error else None) for o in flooded.outcomes[call_id]
        }
        assert len(statuses) == 1, (call_id, statuses)

    codes = _codes(flooded, a_ids)
    refused = [c for c in a_ids if _code(flooded.outcomes[c][0]) is ErrorCode.RATE_LIMITED]
    # Admitted: succeeded, or (forged) passed on for the authorizer to refuse.
    passed = ErrorCode.UNAUTHENTICATED if case.forged else None
    admitted = [
        c
        for c in a_ids
        if (flooded.outcomes[c][0].status is Status.SUCCEEDED and passed is None)
        or (passed is not None and _code(flooded.outcomes[c][0]) is passed)
    ]
    assert len(refused) + len(admitted) == flood, codes
    flood_seconds = max(flooded.sent[c] for c in a_ids) - min(flooded.sent[c] for c in a_ids)
    # The span over which admission decided A's calls (tokens refill meanwhile).
    decided_seconds = max(
        (flooded.ended[c] for c in refused), default=min(flooded.sent[c] for c in a_ids)
    ) - min(flooded.sent[c] for c in a_ids)
    slowest_refusal = max((flooded.latency(c) for c in refused), default=0.0)
    for call_id in refused:
        error = flooded.outcomes[call_id][0].error
        assert error is not None and error.retryable and (error.retry_after or 0) > 0
    assert all(flooded.outcomes[c][0].status is Status.SUCCEEDED for c in b_ids)
    # A's admitted calls: the burst plus the rate over the flood, within 10 %: at most over
    # the span admission decided in (from A's first call to its last refusal), at least over
    # the span A published in (a limiter refusing nearly everything fails).
    if case.forged:
        a = settings.admission
        rate, burst = a.unverified_rate, a.unverified_burst
    else:
        rate, burst = (RATE, BURST) if case.limited else (0.0, 0.0)
    expected = (
        [0.9 * (burst + rate * flood_seconds), 1.1 * (burst + rate * decided_seconds)]
        if rate
        else []
    )
    figures: dict[str, Any] = {
        "case": {"shared": case.shared, "limited": case.limited, "forged": case.forged},
        "flood": flood,
        "burst": BURST,
        "flood_paced_over_s": FLOOD_SECONDS,
        "flood_seconds": round(flood_seconds, 3),
        "decided_seconds": round(decided_seconds, 3),
        "a_admitted": len(admitted),
        "expected_admitted": [round(x, 1) for x in expected],
        "a_codes": codes,
        "a_refused": len(refused),
        "slowest_refusal_s": round(slowest_refusal, 3),
        "b_alone_p50_ms": round(statistics.median(base) * 1000, 1),
        "b_alone_max_ms": round(max(base) * 1000, 1),
        "b_flood_p50_ms": round(statistics.median(loaded) * 1000, 1),
        "b_flood_max_ms": round(max(loaded) * 1000, 1),
        # What the flood cost each process, and how busy the machine was (1-min load).
        "cpu_s": {k: round(v - cpu_before.get(k, 0.0), 2) for k, v in cpu_after.items()},
        "load_1m": [round(load_before, 1), round(load_after, 1)],
        # Per hop: [median, max].
        "b_alone_hops_ms": _hops(settings, b_alone),
        "b_flood_hops_ms": _hops(settings, b_ids),
        "b_flood_ms": [round(x * 1000) for x in loaded],
        # Per B call, outside the pipeline: [its publication, its outcome's delivery] (ms; the
        # delivery is the slowest record of the poll that brought it).
        "b_alone_outside_ms": list(alone.outside(b_alone).values()),
        "b_flood_outside_ms": list(flooded.outside(b_ids).values()),
        # The test process's longest garbage collection meanwhile (it times A's refusals).
        "watcher_gc_max_ms": round(max(pauses, default=0.0) * 1000, 1),
    }
    return figures


def _assert_bounds(figures: dict[str, Any], *, slowest_factor: float = SLOWEST_FACTOR) -> None:
    """Issue 45's bounds: A's admitted calls in range, A's refusals within a second, B's
    median within 2x and its slowest within ``slowest_factor`` of B alone."""
    low_high = figures["expected_admitted"]
    if low_high:
        assert low_high[0] <= figures["a_admitted"] <= low_high[1], figures
    assert figures["slowest_refusal_s"] <= 1.0, figures
    assert figures["b_flood_p50_ms"] <= 2 * figures["b_alone_p50_ms"], figures
    assert figures["b_flood_max_ms"] <= slowest_factor * figures["b_alone_max_ms"], figures


@pytest.mark.timeout(120)
def test_the_client_retries_a_rate_limited_call_with_the_same_key(admitting: Pipeline) -> None:
    settings = admitting.settings
    token = context_token(settings, tenant="tenant-a")

    async def scenario() -> tuple[Outcome | Pending, Outcome | Pending, int]:
        async with RatifierClient.from_settings(settings) as client:
            first = await client.call("get_refund_policy", {}, context=token, within=30)
            again = await client.call(
                "get_refund_policy", {}, context=token, idempotency_key=key, within=30
            )
            return first, again, client.rate_limited_retries

    key = f"retry-{uuid.uuid4().hex[:8]}"
    first, again, retries = run(scenario())
    assert isinstance(first, Outcome) and _code(first) is not ErrorCode.RATE_LIMITED
    # The second call met the empty bucket, waited its retry_after (≈ 10 s less the first
    # call's time) and was admitted.
    assert retries == 1
    assert isinstance(again, Outcome) and _code(again) is not ErrorCode.RATE_LIMITED
    proposals = [
        json.loads(r.value)
        for r in run(read_to_end(settings, [Topic.PROPOSED]))
        if r.value and key.encode() in r.value
    ]
    assert len(proposals) == 2  # two proposals (two call ids), one idempotency key
    assert {p["idempotency_key"] for p in proposals} == {key}
    assert len({p["call_id"] for p in proposals}) == 2
