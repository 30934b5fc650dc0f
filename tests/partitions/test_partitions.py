"""`make partitions`: faults BETWEEN hosts (issue 30) on a multi-host cluster in network
namespaces (tests/partitions/network.py, cluster.py), under the chaos suite's mixed load and
checked by its history checker (tests/chaos/test_chaos.py: MixedLoad).

This test runs inside the driver's namespace (rpt-ctl); `deploy/partitions/cluster run`
builds the network first and removes it afterwards. Faults, in order (the approval-join's three
go last — two of them left it stuck in the first runs — so that what they leave is not
counted against the others):

  broker_minority      k3 cut from k1, k2 (both ways) but still reached by clients; healed
  executor_no_redis    executor e1 cut from Redis while it holds claims (provider slowed)
  executor_no_postgres e1 cut from PostgreSQL, the same way
  executor_no_kafka    e1 cut from every broker, longer than its session and claim lease
  slow_links           every link through the proxy: 300 ± 100 ms per chunk, 5 % resets
  clock_skew           e1 and s1 restarted with their clocks 20 s ahead (libfaketime)
  rolling_restart      k1, k2, k3 stopped (SIGTERM) and started one after the other
  scale_out            a third streams worker and a fourth executor added, then s2 and e2
                       removed; answers may pause at most SCALE_PAUSE_BOUND seconds
  leader_isolated      the leader of proposed[0] cut from every host; healed
  coordinator_isolated the approval-join group's coordinator cut from every host; healed
                       (the first run's leader_isolated stall: its leader was the coordinator)
  streams_no_kafka     streams worker s1 cut from every broker, longer than its session,
                       with approvals pending

Each fault is probed while in force, or its row is an error (`fault_error`): a TCP
connection across a cut fails while it lasts (and one that the cut must not touch still
connects), and connects again once healed; the slowed proxy is measured slow (a Redis PING
through it, against the same PING before and after); each skewed process's own clock, read
from the `Date` header it stamps on its answers, is SKEW_SECONDS ahead, and true again after
its restart (a missing libfaketime is an error, not an unskewed run); each stopped broker no
longer accepts connections; the scale-out's new workers become ready. Every row also holds the
chaos suite's checks (tests/chaos/expectations.py): each acknowledged call's outcome by kind
and a minimum of acknowledged calls and provider effects.

RATIFIER_PARTITIONS_ONLY=name[,name] selects faults; RATIFIER_PARTITIONS_SECONDS sets the load
per fault (default 60; the minimums scale with it; slow_links keeps its 100 s, rolling_restart
1.5 times the setting); RATIFIER_CHAOS_RATE the rate. One fault, quickly (about 2 minutes, most
of it the cluster's start; what `make mutants` runs per break):

    RATIFIER_PARTITIONS_ONLY=executor_no_redis RATIFIER_PARTITIONS_SECONDS=30 make partitions
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from ratifier.topics import ensure_topics
from schemas.names import STREAMS_APP_ID, Topic
from tests.chaos.test_chaos import RATE, MixedLoad
from tests.e2e.conftest import ARTIFACTS, SigningKeys
from tests.e2e.executor_kit import seed_payments
from tests.e2e.test_reconciliation import faults as provider_faults
from tests.e2e.test_replicated_cluster import describe, wait_partitions
from tests.partitions import network, proxy, report
from tests.partitions.cluster import (
    CLIENT_PORT,
    DIRECT_PORT,
    INTERNAL_PORT,
    PG_PORT,
    REDIS_PORT,
    WORKER_HOSTS,
    Cluster,
    clock_ahead,
    cluster,
    offset_agrees,
    readiness_urls,
    wait_clock_offset,
)
from tests.partitions.network import BROKERS, address, proxy_address
from tests.services import run

pytestmark = pytest.mark.partitions

ONLY = {n for n in os.environ.get("RATIFIER_PARTITIONS_ONLY", "").split(",") if n}
LOAD_SECONDS = float(os.environ.get("RATIFIER_PARTITIONS_SECONDS", "60"))
HOLD_SECONDS = 25.0  # a partition lasts this long (several sessions and claim leases)
SLOW_SECONDS = 60.0
SCALE_PAUSE_BOUND = 20.0
SKEW_SECONDS = 20
EVERYONE = (f"{network.SUBNET}.0/25", f"{network.SUBNET}.128/25")  # more specific than /24
HEAL_SECONDS = 30.0  # a healed route is gone at once; a probe gets this long to connect again
SLOW = {"delay_ms": 300, "jitter_ms": 100, "reset_probability": 0.05}
# Through the slowed proxy a round trip waits for two chunks, each at least delay - jitter.
SLOW_ROUND_TRIP = 2 * (SLOW["delay_ms"] - SLOW["jitter_ms"]) / 1000
READY_SECONDS = 120.0  # the scale-out's new workers: ready (partitions assigned) within this


class FaultNotInForce(RuntimeError):
    """A fault's probe saw it not take effect (or not heal): the row is an error."""


@dataclass(frozen=True)
class Probe:
    """A TCP connection from inside ``host`` to ``destination:port`` (to Redis: a PING that
    must be answered, so that a server refusing its clients does not pass for reachable)."""

    host: str
    destination: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}->{self.destination}:{self.port}"

    def connects(self) -> bool:
        if self.port == REDIS_PORT:
            return network.connects(
                self.host, self.destination, self.port, request=b"PING\r\n", expect=b"+PONG"
            )
        return network.connects(self.host, self.destination, self.port)


def _probe_kafka(host: str) -> list[Probe]:
    """``host`` to every broker, through the proxy and directly."""
    return [Probe(host, proxy_address(b), CLIENT_PORT) for b in BROKERS] + [
        Probe(host, address(b), DIRECT_PORT) for b in BROKERS
    ]


class PartitionSuite(MixedLoad):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.pipeline)
        self.cluster = cluster
        self.notes: dict[str, Any] = {}
        self.evidence: dict[str, str] = {}  # per fault, what its probes saw (the table)
        # No fault here makes the provider refuse refunds (expectations.PROVIDER_GAVE_UP).
        self.provider_fails = frozenset()

    # --- helpers ----------------------------------------------------------------------------

    @property
    def direct_bootstrap(self) -> str:
        return self.settings.kafka_bootstrap

    def our_topics(self) -> list[str]:
        return [self.settings.topic(t) for t in Topic]

    async def wait_isr_full(self, timeout: float = 180) -> float:
        return await wait_partitions(
            self.direct_bootstrap,
            self.our_topics(),
            lambda p: len(p["isr"]) == 3,
            timeout,
            "every partition with three in-sync replicas",
        )

    async def connects(self, probes: Sequence[Probe]) -> list[bool]:
        return list(await asyncio.gather(*(asyncio.to_thread(p.connects) for p in probes)))

    async def partition(
        self,
        name: str,
        blackholes: Sequence[tuple[str, tuple[str, ...]]],
        *,
        cut: Sequence[Probe],
        kept: Sequence[Probe] = (),
        seconds: float = HOLD_SECONDS,
    ) -> None:
        """Blackhole routes (host, destinations) for ``seconds``. Before: every probe
        connects; while in force, at its start and just before healing: every ``cut`` probe
        fails and every ``kept`` one still connects; healed: every probe connects again
        (within HEAL_SECONDS). Anything else raises FaultNotInForce once healed."""
        everything = [*cut, *kept]
        wrong: list[str] = []
        before = await self.connects(everything)
        wrong += [f"before: {p} failed" for p, ok in zip(everything, before, strict=True) if not ok]
        try:
            for host, destinations in blackholes:
                await asyncio.to_thread(network.blackhole, host, destinations, on=True)
            for moment in ("at the cut", "before healing"):
                if moment == "before healing":
                    await asyncio.sleep(seconds)
                during = await self.connects(everything)
                wrong += [
                    f"{moment}: {p} {'connected' if ok else 'failed'}"
                    for p, ok, must in zip(
                        everything, during, [False] * len(cut) + [True] * len(kept), strict=True
                    )
                    if ok != must
                ]
        finally:
            for host, destinations in blackholes:
                await asyncio.to_thread(network.blackhole, host, destinations, on=False)
        deadline = time.monotonic() + HEAL_SECONDS
        while not all(after := await self.connects(everything)):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        wrong += [f"healed: {p} failed" for p, ok in zip(everything, after, strict=True) if not ok]
        self.note(name, probes={"cut": [str(p) for p in cut], "kept": [str(p) for p in kept]})
        self.evidence[name] = f"{len(cut)} cut, {len(kept)} kept"
        if wrong:
            raise FaultNotInForce(f"{name}: {wrong}")

    def note(self, name: str, **facts: Any) -> None:
        self.notes.setdefault(name, {}).update(facts)

    def kafka_of(self, *brokers: str) -> tuple[str, ...]:
        return tuple(a for b in brokers for a in (address(b), proxy_address(b)))

    async def restart(self, name: str, command: str, **env: str) -> None:
        def again() -> None:
            self.pipeline.stop_worker(name)
            self.pipeline.start(command, name, **env)

        await asyncio.to_thread(again)

    # --- faults -----------------------------------------------------------------------------

    async def broker_minority(self) -> None:
        lonely, others = "k3", ("k1", "k2")
        self.note("broker_minority", isolated=lonely)
        await self.partition(
            "broker_minority",
            [(lonely, tuple(address(b) for b in others))]
            + [(host, (address(lonely),)) for host in others],
            cut=[Probe(lonely, address(b), INTERNAL_PORT) for b in others]
            + [Probe(b, address(lonely), INTERNAL_PORT) for b in others],
            # Clients still reach it: the proxy's link to it is not cut.
            kept=[Probe("proxy", address(lonely), CLIENT_PORT)],
        )

    async def leader_isolated(self) -> None:
        topic = self.settings.topic(Topic.PROPOSED)
        leader = next(
            p["leader"]
            for p in await describe(self.direct_bootstrap, [topic])
            if p["partition"] == 0
        )
        host = BROKERS[int(leader) - 1]
        self.note("leader_isolated", isolated=host, partition=f"{topic}[0]")
        await self.isolate("leader_isolated", host)

    async def isolate(self, name: str, host: str) -> None:
        """Broker ``host`` cut from every host: it reaches no other broker, and the driver's
        connections to it time out (its answers are dropped) while the others' still work."""
        others = [b for b in BROKERS if b != host]
        await self.partition(
            name,
            [(host, EVERYONE)],
            cut=[Probe(host, address(b), INTERNAL_PORT) for b in others]
            + [
                Probe("ctl", address(host), DIRECT_PORT),
                Probe("proxy", address(host), CLIENT_PORT),
            ],
            kept=[Probe("ctl", address(b), DIRECT_PORT) for b in others],
        )

    async def coordinator_isolated(self) -> None:
        group = self.settings.group(STREAMS_APP_ID)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.direct_bootstrap)
        await admin.start()
        try:
            coordinator = await admin.find_coordinator(group)
        finally:
            await admin.close()
        host = BROKERS[int(coordinator) - 1]
        self.note("coordinator_isolated", isolated=host, group=group)
        await self.isolate("coordinator_isolated", host)

    async def _executor_cut(
        self, name: str, destinations: tuple[str, ...], probes: Sequence[Probe], kept: Probe
    ) -> None:
        # A slow provider keeps e1 inside its effects (claims held) when the cut comes.
        await asyncio.to_thread(provider_faults, self.pipeline, latency_ms=1500)
        try:
            # e2 is not cut from the same service.
            await self.partition(name, [("e1", destinations)], cut=probes, kept=[kept])
        finally:
            await asyncio.to_thread(provider_faults, self.pipeline)

    async def executor_no_redis(self) -> None:
        await self._executor_cut(
            "executor_no_redis",
            (address("redis"), proxy_address("redis")),
            [
                Probe("e1", proxy_address("redis"), REDIS_PORT),
                Probe("e1", address("redis"), REDIS_PORT),
            ],
            Probe("e2", proxy_address("redis"), REDIS_PORT),
        )

    async def executor_no_postgres(self) -> None:
        await self._executor_cut(
            "executor_no_postgres",
            (address("pg"), proxy_address("pg")),
            [Probe("e1", proxy_address("pg"), PG_PORT), Probe("e1", address("pg"), PG_PORT)],
            Probe("e2", proxy_address("pg"), PG_PORT),
        )

    async def executor_no_kafka(self) -> None:
        await self._executor_cut(
            "executor_no_kafka",
            self.kafka_of(*BROKERS),
            _probe_kafka("e1"),
            Probe("e1", proxy_address("redis"), REDIS_PORT),  # only Kafka is cut
        )

    async def streams_no_kafka(self) -> None:
        self.note("streams_no_kafka", approvals_pending_at_cut=len(self.pending_decisions))
        await self.partition(
            "streams_no_kafka",
            [("s1", self.kafka_of(*BROKERS))],
            cut=_probe_kafka("s1"),
            kept=[Probe("s2", proxy_address("k1"), CLIENT_PORT)],
        )

    async def slow_links(self) -> None:
        """Every proxied link slowed and resetting for SLOW_SECONDS; a Redis PING through the
        proxy is measured before (fast), while in force (at least SLOW_ROUND_TRIP) and after
        healing (fast again)."""
        control = self.cluster.proxy_control
        before = await asyncio.to_thread(_ping_seconds)
        await asyncio.to_thread(proxy.control, control, SLOW)
        try:
            during = await asyncio.to_thread(_ping_seconds)
            await asyncio.sleep(SLOW_SECONDS)
        finally:
            counters = await asyncio.to_thread(proxy.control, control, {})
        after = await asyncio.to_thread(_ping_seconds)
        measured = {"before": before, "in_force": during, "healed": after}
        self.note("slow_links", proxy=counters, round_trip_seconds=measured, **SLOW)
        self.evidence["slow_links"] = (
            f"PING {during:.2f} s (before {before:.3f}, after {after:.3f})"
        )
        wrong = [
            f"{when} {seconds:.3f} s"
            for when, seconds in measured.items()
            if (seconds >= SLOW_ROUND_TRIP) != (when == "in_force")
        ]
        if wrong:
            raise FaultNotInForce(
                f"slow_links: PING round trips not as set (slow from {SLOW_ROUND_TRIP} s): {wrong}"
            )

    async def clocks(self, names: Sequence[str]) -> dict[str, tuple[float, float]]:
        """Each process's clock offset (bounds), as its answers' `Date` header shows, once it
        answers (a stages process and its approval-join on a streams host)."""
        urls = {k: u for n in names for k, u in readiness_urls(n).items()}
        found = await asyncio.gather(
            *(asyncio.to_thread(wait_clock_offset, u) for u in urls.values())
        )
        return dict(zip(urls, found, strict=True))

    async def clock_skew(self) -> None:
        """e1 and s1 restarted SKEW_SECONDS ahead for HOLD_SECONDS, then restarted true; each
        process's own clock is read back both times (it must be ahead, then true)."""
        ahead = clock_ahead(SKEW_SECONDS)  # no libfaketime: this row is an error
        skewed = ("executor", "streams")
        for name in skewed:
            await self.restart(name, name, **ahead)
        ahead_seen = await self.clocks(skewed)
        await asyncio.sleep(HOLD_SECONDS)
        for name in skewed:
            await self.restart(name, name)
        true_seen = await self.clocks(skewed)
        self.note(
            "clock_skew",
            hosts=[WORKER_HOSTS[n] for n in skewed],
            ahead_seconds=SKEW_SECONDS,
            offsets_seen={"skewed": ahead_seen, "restored": true_seen},
        )
        self.evidence["clock_skew"] = "clocks " + ", ".join(
            f"{n} +{low:.0f}..{high:.0f} s" for n, (low, high) in ahead_seen.items()
        )
        wrong = [
            f"{n} skewed: {b}" for n, b in ahead_seen.items() if not offset_agrees(b, SKEW_SECONDS)
        ]
        wrong += [f"{n} restored: {b}" for n, b in true_seen.items() if not offset_agrees(b, 0)]
        if wrong:
            raise FaultNotInForce(f"clock_skew: offsets not {SKEW_SECONDS} s then 0: {wrong}")

    async def rolling_restart(self) -> None:
        took = {}
        refused = []
        for host in BROKERS:
            started = time.monotonic()
            await asyncio.to_thread(self.cluster.brokers.stop, host)
            # Stopped: its direct listener no longer accepts (the start below waits for it).
            refused.append(
                not await asyncio.to_thread(network.connects, "ctl", address(host), DIRECT_PORT)
            )
            await asyncio.to_thread(self.cluster.brokers.start, host)
            await asyncio.to_thread(self.cluster.brokers.wait, host)
            await self.wait_isr_full()
            took[host] = round(time.monotonic() - started, 1)
        self.note("rolling_restart", seconds_per_broker=took)
        self.evidence["rolling_restart"] = f"{sum(refused)} of {len(BROKERS)} seen down"
        if not all(refused):
            seen = dict(zip(BROKERS, refused, strict=True))
            raise FaultNotInForce(f"rolling_restart: a stopped broker still accepted: {seen}")

    async def scale_out(self) -> None:
        """s3 and e4 started, s2 and e2 stopped 20 s later; the new workers must then be
        ready (partitions assigned: they took the work over) within READY_SECONDS."""
        await asyncio.to_thread(self.pipeline.start, "streams", "streams-3")
        await asyncio.to_thread(self.pipeline.start, "executor", "executor-4")
        await asyncio.sleep(20)
        await asyncio.to_thread(self.pipeline.stop_worker, "streams-2")
        await asyncio.to_thread(self.pipeline.stop_worker, "executor-2")
        started = time.monotonic()
        urls = {**readiness_urls("streams-3"), **readiness_urls("executor-4")}
        waiting = dict(urls)
        while waiting and time.monotonic() - started < READY_SECONDS:
            answers = await asyncio.gather(
                *(asyncio.to_thread(_readiness, u) for u in waiting.values())
            )
            waiting = {
                n: u
                for (n, u), why in zip(waiting.items(), answers, strict=True)
                if why is not None
            }
            if waiting:
                await asyncio.sleep(1)
        self.note("scale_out", ready_after_seconds=round(time.monotonic() - started, 1))
        self.evidence["scale_out"] = f"{len(urls) - len(waiting)} of {len(urls)} new ready"
        if waiting:
            raise FaultNotInForce(
                f"scale_out: not ready within {READY_SECONDS} s: {sorted(waiting)}"
            )

    async def watch_readiness(self, stop: asyncio.Event) -> dict[str, Any]:
        """What an operator sees during the experiment: every second, each executor's, streams
        worker's and approval-join's /readyz; per process, the seconds it answered 503 (or did
        not answer) and why."""
        seen: dict[str, dict[str, Any]] = {}
        while not stop.is_set():
            names = [w.name for w in self.pipeline.workers if w.process.poll() is None]
            polls = [item for n in names for item in readiness_urls(n).items()]
            answers = await asyncio.gather(*(asyncio.to_thread(_readiness, u) for _, u in polls))
            for (name, _), why in zip(polls, answers, strict=True):
                if why is not None:
                    entry = seen.setdefault(name, {"not_ready_s": 0, "why": []})
                    entry["not_ready_s"] += 1
                    if why not in entry["why"] and len(entry["why"]) < 5:
                        entry["why"].append(why)
            await asyncio.sleep(1)
        return seen

    # --- one row ----------------------------------------------------------------------------

    async def fault_row(
        self, name: str, fault: Callable[[], Awaitable[None]], seconds: float
    ) -> dict[str, Any]:
        started = time.monotonic()
        failed: list[str] = []

        async def guarded() -> None:
            # A fault that cannot be injected is a failed row, not the end of the run.
            try:
                await fault()
            except Exception as exc:
                failed.append(repr(exc))

        stop = asyncio.Event()
        watching = asyncio.create_task(self.watch_readiness(stop))
        try:
            row = await self.experiment(name, guarded, seconds)
        finally:
            stop.set()
        row["operator_view"] = await watching
        mine = self._mine(name)
        finals = [self.answers.final_at[c] for c in mine if c in self.answers.final_at]
        last_sent = max((call.sent_at for call in mine.values()), default=started)
        row["fault"] = name
        row["commit_lag_total"] = sum(row["streams_commit_lag"].values())
        row["max_answer_pause_seconds"] = report.max_pause(finals, started + 5, last_sent)
        row["answer_pause_bound_seconds"] = SCALE_PAUSE_BOUND if name == "scale_out" else None
        row["notes"] = self.notes.get(name)
        row["evidence"] = self.evidence.get(name)
        row["fault_error"] = failed[0] if failed else None
        return row


def _ping_seconds(samples: int = 5, attempts: int = 20) -> float:
    """The median of ``samples`` Redis PING round trips through the proxy, each on a new
    connection (one the slowed proxy resets is tried again)."""
    seen: list[float] = []
    for _ in range(attempts):
        try:
            seen.append(
                proxy.round_trip((proxy_address("redis"), REDIS_PORT), b"PING\r\n", b"+PONG")
            )
        except OSError:
            continue
        if len(seen) == samples:
            return statistics.median(seen)
    raise FaultNotInForce(f"only {len(seen)} of {samples} PINGs through the proxy answered")


def _readiness(url: str) -> str | None:
    """None when ready, else why not (the body's `why`, or the transport error)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as refused:
        try:
            return str(json.loads(refused.read()).get("why"))
        except ValueError:
            return f"HTTP {refused.code}"
        finally:
            refused.close()
    except (OSError, ValueError) as unreachable:
        return f"no answer ({type(unreachable).__name__})"
    return None if body.get("ready", True) else str(body.get("why"))


# The faults that left the approval-join stuck in the first runs (docs/reliability.md,
# "Findings") go last, so that what they leave behind is not counted against the others.
FAULTS: list[tuple[str, Callable[[PartitionSuite], Callable[[], Awaitable[None]]], float]] = [
    ("broker_minority", lambda s: s.broker_minority, LOAD_SECONDS),
    ("executor_no_redis", lambda s: s.executor_no_redis, LOAD_SECONDS),
    ("executor_no_postgres", lambda s: s.executor_no_postgres, LOAD_SECONDS),
    ("executor_no_kafka", lambda s: s.executor_no_kafka, LOAD_SECONDS),
    ("slow_links", lambda s: s.slow_links, SLOW_SECONDS * 1.5 + 10),
    ("clock_skew", lambda s: s.clock_skew, LOAD_SECONDS),
    ("rolling_restart", lambda s: s.rolling_restart, LOAD_SECONDS * 1.5),
    ("scale_out", lambda s: s.scale_out, LOAD_SECONDS),
    ("leader_isolated", lambda s: s.leader_isolated, LOAD_SECONDS),
    ("coordinator_isolated", lambda s: s.coordinator_isolated, LOAD_SECONDS),
    ("streams_no_kafka", lambda s: s.streams_no_kafka, LOAD_SECONDS),
]


@pytest.mark.timeout(2400)
def test_partitions(signing_keys: SigningKeys) -> None:
    chosen = [f for f in FAULTS if not ONLY or f[0] in ONLY]
    assert chosen, f"RATIFIER_PARTITIONS_ONLY names no fault of {[f[0] for f in FAULTS]}"
    rows: list[dict[str, Any]] = []
    exited: list[str] = []
    with cluster(signing_keys, ARTIFACTS / "partitions-logs") as services:
        settings = services.pipeline.settings
        run(ensure_topics(settings, replication_factor=3, min_insync_replicas=2))
        seed_payments(settings)
        pipeline = services.pipeline
        pipeline.start("streams", "streams")
        pipeline.start("streams", "streams-2")
        for name in ("executor", "executor-2", "executor-3"):
            pipeline.start("executor", name)
        pipeline.start("reconciler", "reconciler")
        pipeline.wait_ready(timeout=240)
        suite = PartitionSuite(services)
        run(suite.wait_isr_full())
        try:
            for name, fault, seconds in chosen:
                rows.append(asyncio.run(suite.fault_row(name, fault(suite), seconds)))
                print(f"partitions: {json.dumps(rows[-1])}", flush=True)
                dead = [w.name for w in pipeline.workers if w.process.poll() is not None]
                exited += [f"{name}: {w}" for w in dead]
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            document = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "rate_calls_per_s": RATE,
                "hold_seconds": HOLD_SECONDS,
                "scale_out_pause_bound_seconds": SCALE_PAUSE_BOUND,
                "faults": rows,
            }
            (ARTIFACTS / "partitions.json").write_text(json.dumps(document, indent=2) + "\n")
            print("\n" + report.render(rows), flush=True)
            print("\n" + report.render_evidence(rows), flush=True)
    failures = {r["fault"]: report.violations(r) for r in rows if report.violations(r)}
    assert not failures, f"guarantees violated: {failures} (test-artifacts/partitions.json)"
    assert not exited, f"processes exited: {exited}"
