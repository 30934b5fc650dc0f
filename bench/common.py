"""Shared pieces of the benchmarks: machine facts, envelopes, Kafka counting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import NewTopic
from psycopg import sql

from bench.duplicates import FINAL
from config.settings import DEVELOPMENT_MODE_ENV, Settings
from ratifier.migrate import migrate
from ratifier.processes import WorkerProcess, start_worker_args
from ratifier.topics import delete_topics, ensure_topics
from runtime.clients import kafka_admin, kafka_consumer, kafka_producer, pg_connect
from runtime.identity import context_keys, issue_context_token
from schemas.names import Topic


def machine_facts() -> str:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    kafka = os.environ.get("RATIFIER_KAFKA_VERSION", "4.4.0")
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git or '?'}, {os.cpu_count()} "
        f"cores ({cpu}), Python {platform.python_version()}, Kafka {kafka} (one node, "
        f"KRaft, loopback), acks=all"
    )


# A session id of realistic length brings the envelopes to about 800 bytes, the size the
# targets are stated for (the signed context token dominates an envelope).
SESSION_ID = "sess-" + "0123456789abcdef" * 16


def read_envelopes(settings: Settings, n: int, run_id: str) -> list[bytes]:
    """``n`` valid get_payment proposals, about 800 bytes each (the JWT dominates)."""
    token = issue_context_token(
        context_keys(settings),
        sub="bench-agent",
        tenant="tenant-a",
        roles=("support", "reader", "bench"),
        sid=SESSION_ID,
    )
    now = datetime.now(UTC).isoformat()
    return [
        json.dumps(
            {
                "v": 1,
                "call_id": f"b-{run_id}-{i}",
                "tool": "get_payment",
                "arguments": {"payment_id": "pay_A1001"},
                "context": token,
                "proposed_at": now,
                "idempotency_key": f"b-{run_id}-{i}",
            }
        ).encode()
        for i in range(n)
    ]


async def produce_all(
    settings: Settings,
    topic: str,
    values: Sequence[bytes],
    keys: Callable[[int], bytes] | None = None,
) -> float:
    """Publish ``values`` as fast as the producer allows (the i-th keyed ``keys(i)``, else
    its index); return the start time."""
    producer = kafka_producer(
        settings,
        linger_ms=5,
        max_batch_size=256 * 1024,
        enable_idempotence=False,  # the baseline: a plain acks=all producer
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [
            await producer.send(topic, value=v, key=keys(i) if keys else str(i).encode())
            for i, v in enumerate(values)
        ]
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return started


def _follower(settings: Settings, topic: str) -> AIOKafkaConsumer:
    """A consumer that follows ``topic`` from its start, in large fetches, without a group."""
    return kafka_consumer(
        settings,
        topic,
        group=None,
        max_poll_records=5000,
        fetch_max_bytes=16 * 1024 * 1024,
    )


async def count_until(
    settings: Settings, topic: str, n: int, timeout: float, match: bytes | None = None
) -> float:
    """Consume ``topic`` from the start until ``n`` records (containing ``match``) were seen;
    return the time the last one arrived."""
    consumer = _follower(settings, topic)
    await consumer.start()
    seen = 0
    deadline = time.perf_counter() + timeout
    try:
        while seen < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{topic}: saw {seen} of {n}")
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batches.values():
                seen += sum(1 for r in records if match is None or match in (r.value or b""))
        return time.perf_counter()
    finally:
        await consumer.stop()


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


RESULTS = Path(__file__).parent / "RESULTS.md"


def is_executor(process: str) -> bool:
    """Whether a pipeline worker (by its name in the benchmark) is an executor."""
    return process.startswith("executor")


HOPS = 4  # proposed → validated → authorized → committed → outcomes
HOP_TOPICS = (Topic.PROPOSED, Topic.VALIDATED, Topic.AUTHORIZED, Topic.COMMITTED, Topic.OUTCOMES)
BENCH_PAYMENTS = 256  # reads spread over this many payments (no single hot row)


# --- worker processes, outcomes and CPU time: shared by every benchmark --------------------

BENCH_DATABASE = "ratifier_bench"
LOG_ROOT = Path("test-artifacts") / "bench-logs"


def bench_database_url() -> str:
    """The benchmarks' own database (created on first use): its payments can be reset and
    its ledger grows without touching the shared test database."""
    base = os.environ.get(
        "RATIFIER_BENCH_DATABASE_URL",
        f"postgresql://ratifier:ratifier@127.0.0.1:5432/{BENCH_DATABASE}",
    )
    name = base.rsplit("/", 1)[1].split("?", 1)[0]
    admin_url = base.rsplit("/", 1)[0] + "/postgres"
    with pg_connect(admin_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %(name)s", {"name": name}
        ).fetchone()
        if found is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return base


def reset_payments(database_url: str) -> None:
    """Full refundable amounts again (the approved-write benchmark refunds 1 minor unit)."""
    with pg_connect(database_url) as conn:
        conn.execute("UPDATE payments SET refundable_minor = amount_minor")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and of every process it started, live (their own
    time, recursively) or ended and waited for (0 once it is gone). `ratifier streams` runs
    its stages and its approval-join as child processes: their CPU is the worker's."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK") + sum(cpu_seconds(c) for c in child_pids(pid))


@dataclass
class BenchRun:
    """One run's prefix (topics, groups), database, worker processes and logs."""

    settings: Settings
    log_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, label: str, partitions: int = 12, **settings: Any) -> BenchRun:
        prefix = f"bench{uuid.uuid4().hex[:8]}."
        return cls(
            settings=Settings(
                topic_prefix=prefix,
                storage={"database_url": bench_database_url()},
                topic_partitions=partitions,
                streams={"http_port": 0},
                development_mode=True,
                **settings,
            ),
            log_dir=LOG_ROOT / f"{label}-{prefix.rstrip('.')}",
        )

    @property
    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            "RATIFIER_TOPIC_PREFIX": s.topic_prefix,
            "RATIFIER_STORAGE__DATABASE_URL": s.storage.database_url,
            "RATIFIER_TOPIC_PARTITIONS": str(s.topic_partitions),
            "RATIFIER_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "RATIFIER_STORAGE__REDIS_URL": s.storage.redis_url,
            "RATIFIER_STREAMS__HTTP_PORT": "0",
            "RATIFIER_OBSERVABILITY__LOG_LEVEL": "WARNING",
            "RATIFIER_PROVIDER_URL": s.provider_url,
            DEVELOPMENT_MODE_ENV: "true" if s.development_mode else "false",
            **self.extra_env,
        }

    async def prepare(self) -> None:
        migrate(self.settings.storage.database_url)
        await ensure_topics(self.settings)

    def start(self, command: str, name: str, *args: str, **env: str) -> WorkerProcess:
        worker = start_worker_args(
            [command, *args], name=name, log_dir=self.log_dir, env={**self.env, **env}
        )
        self.workers.append(worker)
        return worker

    def start_module(self, module: str, name: str, *args: str) -> WorkerProcess:
        """A benchmark helper process (``python -m module args``), same env and logs."""
        worker = start_worker_args(
            list(args), name=name, log_dir=self.log_dir, env=self.env, module=module
        )
        self.workers.append(worker)
        return worker

    def start_provider(self) -> WorkerProcess:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        url = f"http://127.0.0.1:{port}"
        self.settings = self.settings.model_copy(update={"provider_url": url})
        worker = self.start_module("testsupport.provider", "provider", "--port", str(port))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/_stats", timeout=2):
                    return worker
            except OSError:
                if worker.process.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"provider did not start:\n{worker.log_tail()}")

    def stop(self, worker: WorkerProcess) -> None:
        worker.stop(timeout=15)
        if worker in self.workers:
            self.workers.remove(worker)

    async def close(self) -> None:
        for worker in list(self.workers):
            worker.stop(timeout=15)
        self.workers.clear()
        try:
            await asyncio.wait_for(delete_topics(self.settings), timeout=60)
        except Exception as exc:
            print(f"  (could not delete topics {self.settings.topic_prefix}*: {exc})")


def read_proposal(
    token: str,
    call_id: str,
    *,
    tool: str = "get_payment",
    idempotency_key: str | None = None,
    **args: Any,
) -> bytes:
    """A proposal of ``tool`` with ``args`` (a read of pay_A1001 by default); without
    ``idempotency_key`` the call's key is its call id."""
    proposal: dict[str, Any] = {
        "v": 1,
        "call_id": call_id,
        "tool": tool,
        "arguments": args or {"payment_id": "pay_A1001"},
        "context": token,
        "proposed_at": datetime.now(UTC).isoformat(),
    }
    if idempotency_key is not None:
        proposal["idempotency_key"] = idempotency_key
    return json.dumps(proposal).encode()


def agent_token(
    settings: Settings, roles: tuple[str, ...] = ("support",), sub: str = "bench-agent"
) -> str:
    return issue_context_token(
        context_keys(settings), sub=sub, tenant="tenant-a", roles=roles, sid=SESSION_ID
    )


@dataclass
class Outcome:
    call_id: str
    status: str
    at: float  # outcome timestamp (epoch seconds)
    proposed_at: float  # epoch seconds, from the proposal we sent
    seen: float  # when the bench read it (perf_counter)
    delivered_at: float  # the same moment, epoch seconds (as proposed_at)


class OutcomeWatcher:
    """Follows the run's outcomes topic from the start and keeps each call's terminal
    outcome; ``wait`` returns when given calls ended (bounded)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.proposed: dict[str, float] = {}
        self.ended: dict[str, Outcome] = {}
        self.terminal_counts: dict[str, int] = {}
        # Every distinct (status, error code) of each call's outcome records, `unknown`
        # included (reconciliation follows it with the final one).
        self.answers: dict[str, set[tuple[str, str | None]]] = {}
        self.awaiting: set[str] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._consumer = kafka_consumer(
            self._settings,
            self._settings.topic(Topic.OUTCOMES),
            group=None,
            max_poll_records=5000,
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=100, max_records=5000)
            now, delivered = time.perf_counter(), time.time()
            for records in batches.values():
                for r in records:
                    try:
                        body = json.loads(r.value or b"")
                    except ValueError:
                        continue
                    call_id, status = body.get("call_id"), body.get("status")
                    if status == "awaiting_approval":
                        self.awaiting.add(call_id)
                        continue
                    self.terminal_counts[call_id] = self.terminal_counts.get(call_id, 0) + 1
                    error = body.get("error")
                    code = error.get("code") if isinstance(error, dict) else None
                    self.answers.setdefault(call_id, set()).add((status, code))
                    if call_id in self.ended:
                        continue
                    at = datetime.fromisoformat(body["at"]).timestamp()
                    self.ended[call_id] = Outcome(
                        call_id=call_id,
                        status=status,
                        at=at,
                        proposed_at=self.proposed.get(call_id, at),
                        seen=now,
                        delivered_at=delivered,
                    )
            if batches:
                self._changed.set()

    async def wait(self, call_ids: Sequence[str], timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while True:
            if all(c in self.ended for c in call_ids):
                return True
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))

    def settled(self, call_id: str) -> bool:
        """Whether the call has a final outcome (not only `unknown`)."""
        return any(status in FINAL for status, _code in self.answers.get(call_id, ()))

    async def wait_settled(self, call_ids: Sequence[str], timeout: float) -> bool:
        """Like :meth:`wait`, until every call has a final outcome (an `unknown` one waits
        for reconciliation)."""
        deadline = time.perf_counter() + timeout
        while True:
            if all(self.settled(c) for c in call_ids):
                return True
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))

    async def changed(self, timeout: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


class Proposer:
    """Publishes proposals with acks=all and records when each was proposed."""

    def __init__(self, settings: Settings, watcher: OutcomeWatcher, token: str) -> None:
        self._settings = settings
        self._watcher = watcher
        self._token = token
        self._producer = kafka_producer(settings, enable_idempotence=False)
        self.sent = 0

    async def start(self) -> None:
        await self._producer.start()

    async def propose(
        self,
        call_id: str,
        *,
        tool: str = "get_payment",
        idempotency_key: str | None = None,
        **args: Any,
    ) -> Any:
        value = read_proposal(
            self._token, call_id, tool=tool, idempotency_key=idempotency_key, **args
        )
        self._watcher.proposed[call_id] = time.time()
        self.sent += 1
        return await self._producer.send(
            self._settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
        )

    async def flush(self) -> None:
        await self._producer.flush()

    async def stop(self) -> None:
        await self._producer.stop()


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def create_topics(run: BenchRun, names: list[str]) -> None:
    admin = kafka_admin(run.settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, run.settings.topic_partitions, 1) for n in names])
    finally:
        await admin.close()


async def drain(
    run: BenchRun,
    start: Callable[[], list[Any]],
    source: str,
    target: str,
    n: int,
    values: list[bytes] | None,
    timeout: float,
    *,
    profile_to: Path | None = None,
    keys: Callable[[int], bytes] | None = None,
) -> tuple[float, float]:
    """Publish ``values`` to ``source`` (a backlog), start the processes, and time the
    first to the n-th record on ``target``. Returns (records/s, CPU µs per record of the
    started processes while draining). With ``profile_to``, py-spy samples the first
    process from the first record on (start-up is not in the profile)."""
    if values is not None:
        await produce_all(run.settings, source, values, keys)
    workers = start()
    spy: subprocess.Popen[bytes] | None = None

    def cpu() -> float:
        return sum(cpu_seconds(w.process.pid) for w in workers)

    def started() -> None:
        nonlocal spy
        if profile_to is not None:
            spy = start_spy(workers[0].process.pid, profile_to)

    try:
        return await steady_rate(run.settings, target, n, timeout, cpu=cpu, on_first=started)
    finally:
        if spy is not None:
            stop_spy(spy)
        for w in workers:
            run.stop(w)


async def steady_rate(
    settings: Settings,
    topic: str,
    n: int,
    timeout: float,
    *,
    cpu: Callable[[], float],
    on_first: Callable[[], None],
) -> tuple[float, float]:
    """Follow ``topic`` from the start until ``n`` records arrived; return (records/s, CPU
    µs per record) over the middle of the drain: from the poll in which the 10th percentile
    record arrived (exclusive) to the one in which the 90th did (inclusive). Timing from the
    first record would count the first output batch without the time it took to make, which
    favours whoever batches more; start-up and the tail are left out too."""
    consumer = _follower(settings, topic)
    await consumer.start()
    seen = 0
    marks: list[tuple[float, int, float]] = []  # (arrival, records so far, CPU s) per poll
    deadline = time.perf_counter() + 150 + timeout
    try:
        while seen < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{topic}: saw {seen} of {n}")
            batches = await consumer.getmany(timeout_ms=50, max_records=5000)
            arrived = sum(len(records) for records in batches.values())
            if not arrived:
                continue
            if seen == 0:
                on_first()
            seen += arrived
            marks.append((time.perf_counter(), seen, cpu()))
    finally:
        await consumer.stop()
    return middle_rate(marks, n)


def middle_rate(marks: Sequence[tuple[float, int, float]], n: int) -> tuple[float, float]:
    """(records/s, CPU µs per record) from polls of (arrival, records so far, CPU seconds):
    between the poll in which the 10th percentile record arrived, exclusive, and the one in
    which the 90th did, inclusive; nan when every record arrived in one poll."""
    low, high = max(1, n // 10), max(1, n * 9 // 10)
    start = next(m for m in marks if m[1] >= low)
    end = next(m for m in marks if m[1] >= high)
    if end[0] <= start[0]:  # too few records for the middle: first to last poll
        start, end = marks[0], marks[-1]
    if end[0] <= start[0]:  # all in one poll: no rate can be told
        return float("nan"), float("nan")
    records = end[1] - start[1]
    return records / (end[0] - start[0]), (end[2] - start[2]) / records * 1e6


# --- py-spy: what a process spends its CPU on -------------------------------------------------

SPY_RATE = 100  # samples per second (idle samples are not recorded)


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def start_spy(pid: int, path: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` into ``path`` (raw format) until :func:`stop_spy`; None
    when py-spy is not installed."""
    spy = py_spy()
    if spy is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            # --subprocesses: a worker's child processes (`ratifier streams`) are its own.
            *(spy, "record", "--nonblocking", "--subprocesses", "-r", str(SPY_RATE), "-f", "raw"),
            *("-o", str(path), "-p", str(pid)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_spy(spy: subprocess.Popen[bytes]) -> None:
    """Stop sampling; py-spy writes its file on SIGINT."""
    if spy.poll() is None:
        spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(timeout=5)


def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (a worker that forks helpers is measured with them)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return []
    return found
