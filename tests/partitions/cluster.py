"""The services of `make partitions`, each started inside its host's network namespace
(tests/partitions/network.py) and reachable only over the virtual network: three KRaft brokers
(RF 3, min ISR 2), Redis, PostgreSQL, the link proxy, the fake provider, and the pipeline's
workers (streams workers on s1..s3, executors on e1..e4, the reconciler on aux).

Kafka's brokers have four listeners: INTERNAL (between brokers, direct), CONTROLLER (the KRaft
quorum, direct), CLIENT (advertised at the broker's proxy address: every worker goes through
the link proxy) and DIRECT (the test driver's own view, not through the proxy).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path

import psycopg

from config.settings import Settings
from ratifier.migrate import migrate
from ratifier.processes import FAKE_PROVIDER_MODULE, WorkerProcess
from tests.e2e.conftest import Pipeline, SigningKeys
from tests.e2e.private_services import (
    initdb,
    kafka_cluster_id,
    kafka_jars,
    kafka_java,
    kafka_replication,
    server_binaries,
)
from tests.partitions import network
from tests.partitions.network import RUN_TAG, address, proxy_address

REPO = Path(__file__).resolve().parents[2]
CLIENT_PORT, INTERNAL_PORT, CONTROLLER_PORT, DIRECT_PORT = 9093, 9092, 9094, 9095
EXECUTOR_HEALTH_PORT, STREAMS_HEALTH_PORT, JOIN_HEALTH_PORT = 9102, 6066, 6067
REDIS_PORT, PG_PORT, PROVIDER_PORT, PROXY_CONTROL_PORT = 6379, 5432, 8080, 7000
# PostgreSQL refuses root; setpriv execs it as `postgres` (runuser would stay in between).
SETPRIV = ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups"]
FAKETIME_PACKAGE, FAKETIME_FILE = "libfaketime", "libfaketime.so.1"
FAKETIME_SHIM = Path(__file__).resolve().parent / "faketime"

# Worker name (as the chaos suite names them) → the host it runs on.
WORKER_HOSTS = {
    "provider": "aux",
    "reconciler": "aux",
    "streams": "s1",
    "streams-2": "s2",
    "streams-3": "s3",
    "executor": "e1",
    "executor-2": "e2",
    "executor-3": "e3",
    "executor-4": "e4",
}


def faketime_library() -> Path | None:
    """Where Debian's libfaketime put its preload library: the package's own file list
    (`dpkg-query -L libfaketime`; the library lives in a private folder, not in ld.so's cache),
    else the multiarch folder; None when it is not installed."""
    if shutil.which("dpkg-query"):
        listed = subprocess.run(
            ["dpkg-query", "-L", FAKETIME_PACKAGE],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.splitlines()
        found = [Path(line) for line in listed if line.endswith(f"/{FAKETIME_FILE}")]
        if found and found[0].is_file():
            return found[0]
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    folders = [Path("/usr/lib") / arch / "faketime", Path("/usr/lib/faketime")]
    return next((f / FAKETIME_FILE for f in folders if (f / FAKETIME_FILE).is_file()), None)


def clock_ahead(seconds: int) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``seconds`` ahead: libfaketime
    (Debian's libfaketime, preloaded) shifts what time(), clock_gettime(CLOCK_REALTIME) and so
    Python's time.time() and datetime.now() return; the monotonic clock stays true, as a
    skewed host's would. No product code reads a test-only setting for this. Without the
    library this raises (the clock-skew row is an error, never an unskewed run); the row also
    reads each skewed process's clock back (`clock_offset`)."""
    library = faketime_library()
    if library is None:
        raise RuntimeError(
            f"{FAKETIME_PACKAGE} is not installed (no {FAKETIME_FILE}): "
            "deploy/partitions/cluster run installs it"
        )
    return {
        # A sleep that works under the library (tests/partitions/faketime/sitecustomize.py).
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(FAKETIME_SHIM), os.environ.get("PYTHONPATH", "")) if p
        ),
        "LD_PRELOAD": str(library),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def spawn(
    host: str,
    argv: list[str],
    *,
    name: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """``argv`` inside ``host``'s namespace (`ip netns exec` replaces itself with it, so the
    process is the one we hold), output to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        ["ip", "netns", "exec", network.namespace(host), *argv],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, RUN_TAG: "1", **(env or {})},
        start_new_session=True,
        cwd=REPO,
    )
    return WorkerProcess(name=name, process=process, log_path=log_path, log_file=log_file)


def wait_port(host: str, port: int, what: str, process: WorkerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.process.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{process.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {host}:{port}") from None
            time.sleep(0.3)


def clock_offset(url: str, timeout: float = 5.0) -> tuple[float, float]:
    """The bounds of (the serving process's wall clock - ours), read from the `Date` header of
    its answer (aiohttp stamps every answer, 200 or 503, with the process's `time.time()`,
    whole seconds): the process read its clock at some moment between our send and our
    receipt, and truncated it."""
    sent = time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            stamp = response.headers["Date"]
    except urllib.error.HTTPError as refused:  # not ready: its clock still answers
        with refused:
            stamp = refused.headers["Date"]
    received = time.time()
    if stamp is None:
        raise RuntimeError(f"{url} answered without a Date header")
    return offset_bounds(stamp, sent, received)


def offset_bounds(stamp: str, sent: float, received: float) -> tuple[float, float]:
    """A `Date` header ``stamp`` (whole seconds, truncated) read between ``sent`` and
    ``received`` on our clock: the lowest and highest the other clock's offset can be."""
    clock = parsedate_to_datetime(stamp).timestamp()
    return clock - received, clock + 1 - sent


def offset_agrees(bounds: tuple[float, float], offset: float, tolerance: float = 1.0) -> bool:
    """Whether ``offset`` (seconds ahead of us) is what ``bounds`` measured, within
    ``tolerance``."""
    low, high = bounds
    return low - tolerance <= offset <= high + tolerance


def wait_clock_offset(url: str, timeout: float = 180) -> tuple[float, float]:
    """``clock_offset`` once the process answers (it may be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return clock_offset(url)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def readiness_urls(name: str) -> dict[str, str]:
    """Where an operator would look: each of the worker's `/readyz` on its host, by the name
    of what answers (a streams host runs two processes: the stages and the approval-join)."""
    host = WORKER_HOSTS[name]
    if name.startswith("executor"):
        return {name: f"http://{address(host)}:{EXECUTOR_HEALTH_PORT}/readyz"}
    if name.startswith("streams"):
        return {
            name: f"http://{address(host)}:{STREAMS_HEALTH_PORT}/readyz",
            f"{name}/join": f"http://{address(host)}:{JOIN_HEALTH_PORT}/readyz",
        }
    return {}


@dataclass
class NamespacedPipeline(Pipeline):
    """The e2e Pipeline whose workers each run on their own host (WORKER_HOSTS)."""

    def start(self, command: str, name: str, **env: str) -> WorkerProcess:
        host = WORKER_HOSTS[name]
        worker = spawn(
            host,
            [sys.executable, "-m", "ratifier.cli", command],
            name=name,
            log_dir=self.log_dir,
            env={**self.env, "RATIFIER_OBSERVABILITY__METRICS_HOST": address(host), **env},
        )
        self.workers.append(worker)
        return worker


@dataclass
class Brokers:
    folder: Path
    jars: Path
    processes: dict[str, WorkerProcess] = field(default_factory=dict)

    def properties(self, node: int, host: str) -> str:
        voters = ",".join(
            f"{i}@{address(b)}:{CONTROLLER_PORT}" for i, b in enumerate(network.BROKERS, 1)
        )
        me = address(host)
        return f"""\
process.roles=broker,controller
node.id={node}
controller.quorum.voters={voters}
listeners=INTERNAL://{me}:{INTERNAL_PORT},CLIENT://{me}:{CLIENT_PORT},DIRECT://{me}:{DIRECT_PORT},CONTROLLER://{me}:{CONTROLLER_PORT}
advertised.listeners=INTERNAL://{me}:{INTERNAL_PORT},CLIENT://{proxy_address(host)}:{CLIENT_PORT},DIRECT://{me}:{DIRECT_PORT}
inter.broker.listener.name=INTERNAL
controller.listener.names=CONTROLLER
listener.security.protocol.map=INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT,DIRECT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={self.folder / host / "data"}
{kafka_replication(replicas=3, min_isr=2, internal_partitions=6)}\
unclean.leader.election.enable=false
num.recovery.threads.per.data.dir=1
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
replica.lag.time.max.ms=8000
"""

    def _java(self, host: str, *args: str) -> list[str]:
        return kafka_java(
            self.jars,
            self.folder / host,
            *args,
            jvm=("-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
        )

    def format(self) -> None:
        cluster = kafka_cluster_id()
        for node, host in enumerate(network.BROKERS, 1):
            (self.folder / host).mkdir(parents=True)
            props = self.folder / host / "server.properties"
            props.write_text(self.properties(node, host))
            subprocess.run(
                [
                    *self._java(host, "kafka.tools.StorageTool", "format", "-t", cluster),
                    "-c",
                    str(props),
                ],
                check=True,
                capture_output=True,
                timeout=180,
            )

    def start(self, host: str) -> None:
        self.processes[host] = spawn(
            host,
            self._java(host, "kafka.Kafka", str(self.folder / host / "server.properties")),
            name=f"kafka-{host}",
            log_dir=self.folder,
        )

    def wait(self, host: str, timeout: float = 180) -> None:
        wait_port(address(host), DIRECT_PORT, f"broker {host}", self.processes[host], timeout)

    def stop(self, host: str) -> None:
        """SIGTERM: a controlled shutdown (leadership moved away first), as an upgrade does."""
        self.processes[host].stop(timeout=60)

    def kill_all(self) -> None:
        """At the end: the data is thrown away, so no controlled shutdown to wait for."""
        for process in self.processes.values():
            process.kill()


@dataclass
class Postgres:
    folder: Path
    bin_dir: Path
    as_user: list[str]
    process: WorkerProcess | None = None

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def initialize(self) -> None:
        initdb(self.bin_dir, self.data, self.as_user)
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {network.SUBNET}.0/24 trust\n")

    def start(self) -> None:
        # In the foreground (no pg_ctl): the process is ours, and it is in the pg namespace.
        self.process = spawn(
            "pg",
            [
                *SETPRIV,
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(PG_PORT),
                "-k",
                str(self.folder),
                "-c",
                f"listen_addresses={address('pg')}",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            name="postgres",
            log_dir=self.folder,
        )
        wait_port(address("pg"), PG_PORT, "postgres", self.process, 60)
        deadline = time.monotonic() + 60
        admin = f"postgresql://postgres@{address('pg')}:{PG_PORT}/postgres"
        while True:
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=3):
                    return
            except psycopg.OperationalError:  # still starting up
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def stop(self) -> None:
        if self.process is not None and self.process.process.poll() is None:
            # SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for every client).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.process.pid, signal.SIGINT)
            self.process.stop(timeout=30)


@dataclass
class Cluster:
    folder: Path
    brokers: Brokers
    postgres: Postgres
    redis: WorkerProcess
    proxy: WorkerProcess
    pipeline: NamespacedPipeline

    @property
    def proxy_control(self) -> tuple[str, int]:
        return (address("proxy"), PROXY_CONTROL_PORT)


def proxy_routes() -> list[str]:
    routes = [
        f"{proxy_address(b)}:{CLIENT_PORT}={address(b)}:{CLIENT_PORT}" for b in network.BROKERS
    ]
    routes += [
        f"{proxy_address('redis')}:{REDIS_PORT}={address('redis')}:{REDIS_PORT}",
        f"{proxy_address('pg')}:{PG_PORT}={address('pg')}:{PG_PORT}",
        f"{proxy_address('provider')}:{PROVIDER_PORT}={address('aux')}:{PROVIDER_PORT}",
    ]
    return routes


def driver_settings(prefix: str, keys: SigningKeys) -> Settings:
    """What the test driver uses: the direct listeners and addresses (not the proxy)."""
    return Settings(
        topic_prefix=prefix,
        topic_partitions=4,
        kafka={"bootstrap": ",".join(f"{address(b)}:{DIRECT_PORT}" for b in network.BROKERS)},
        storage={
            "redis_url": f"redis://{address('redis')}:{REDIS_PORT}/0",
            "database_url": f"postgresql://ratifier:ratifier@{address('pg')}:{PG_PORT}/ratifier",
        },
        context={"jwks_file": str(keys.jwks_path)},
        approvals={"ttl_seconds": 600},
        provider_url=f"http://{address('aux')}:{PROVIDER_PORT}",
    )


def worker_environment(prefix: str, keys: SigningKeys) -> dict[str, str]:
    """What every worker uses: every dependency through its proxy address."""
    bootstrap = ",".join(f"{proxy_address(b)}:{CLIENT_PORT}" for b in network.BROKERS)
    pg = proxy_address("pg")
    return {
        "RATIFIER_TOPIC_PREFIX": prefix,
        "RATIFIER_TOPIC_PARTITIONS": "4",
        "RATIFIER_KAFKA_BOOTSTRAP": bootstrap,
        "RATIFIER_STORAGE__REDIS_URL": f"redis://{proxy_address('redis')}:{REDIS_PORT}/0",
        "RATIFIER_STORAGE__DATABASE_URL": f"postgresql://ratifier:ratifier@{pg}:{PG_PORT}/ratifier",
        "RATIFIER_CONTEXT__JWKS_FILE": str(keys.jwks_path),
        "RATIFIER_APPROVALS__TTL_SECONDS": "600",
        "RATIFIER_PROVIDER_URL": f"http://{proxy_address('provider')}:{PROVIDER_PORT}",
        "RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS": "10",
        # Each worker has a host of its own: the default ports, on the host's address.
        "RATIFIER_OBSERVABILITY__EXECUTOR_METRICS_PORT": str(EXECUTOR_HEALTH_PORT),
        "RATIFIER_OBSERVABILITY__RECONCILER_METRICS_PORT": "9103",
        "RATIFIER_OBSERVABILITY__AUDIT_METRICS_PORT": "0",
        "RATIFIER_STREAMS__HTTP_PORT": str(STREAMS_HEALTH_PORT),
        "RATIFIER_STREAMS__JOIN_HTTP_PORT": str(JOIN_HEALTH_PORT),
        "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.5",
        "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS": "5",
        "RATIFIER_RECONCILER__ATTEMPTS": "1000",
    }


@contextmanager
def cluster(keys: SigningKeys, log_dir: Path) -> Iterator[Cluster]:
    """Every service on its host, migrated and seeded, the pipeline answering; everything
    stopped and its folders removed on the way out, also on failure."""
    jars, pg_bin = kafka_jars(), server_binaries()
    if jars is None or pg_bin is None or shutil.which("redis-server") is None:
        raise RuntimeError("Kafka jars, PostgreSQL or redis-server missing: run `make up`")
    shutil.rmtree(log_dir, ignore_errors=True)  # this run's logs only
    folder = Path(tempfile.mkdtemp(prefix="ratifier-partitions-"))
    folder.chmod(0o755)  # PostgreSQL runs as `postgres` below it
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        (folder / "pg").mkdir()
        os.chown(folder / "pg", owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        proxy = spawn(
            "proxy",
            [sys.executable, "-m", "tests.partitions.proxy"]
            + ["--control", f"{address('proxy')}:{PROXY_CONTROL_PORT}"]
            + [arg for route in proxy_routes() for arg in ("--route", route)],
            name="proxy",
            log_dir=log_dir,
        )
        stack.callback(proxy.stop)
        brokers = Brokers(folder=folder / "kafka", jars=jars)
        stack.callback(brokers.kill_all)
        brokers.format()
        for host in network.BROKERS:
            brokers.start(host)
        postgres = Postgres(folder=folder / "pg", bin_dir=pg_bin, as_user=as_user)
        stack.callback(postgres.stop)
        postgres.initialize()
        postgres.start()
        (folder / "redis").mkdir()
        redis = spawn(
            "redis",
            [
                "redis-server",
                "--port",
                str(REDIS_PORT),
                "--bind",
                address("redis"),
                "--dir",
                str(folder / "redis"),
                "--save",
                "",
                "--appendonly",
                "yes",
                # Protected mode (no password) refuses every client not on loopback, bind or
                # not (Redis 7): before this line every worker here was refused ("DENIED
                # Redis is running in protected mode"), so the executors ran without Redis
                # and executor_no_redis cut a link nobody could use. Its probes PING now.
                "--protected-mode",
                "no",
            ],
            name="redis",
            log_dir=log_dir,
        )
        stack.callback(redis.stop)
        wait_port(address("redis"), REDIS_PORT, "redis", redis, 30)
        admin = f"postgresql://postgres@{address('pg')}:{PG_PORT}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE ratifier LOGIN PASSWORD 'ratifier'")
            conn.execute("CREATE DATABASE ratifier OWNER ratifier")
        prefix = f"parts{uuid.uuid4().hex[:6]}."
        settings = driver_settings(prefix, keys)
        migrate(settings.storage.database_url)
        for host in network.BROKERS:
            brokers.wait(host)
        pipeline = NamespacedPipeline(
            settings=settings,
            workers=[],
            env=worker_environment(prefix, keys),
            log_dir=log_dir,
            provider_url=settings.provider_url,
        )
        stack.callback(pipeline.stop)
        provider = spawn(
            "aux",
            [
                sys.executable,
                "-m",
                FAKE_PROVIDER_MODULE,
                "--host",
                address("aux"),
                "--port",
                str(PROVIDER_PORT),
            ],
            name="provider",
            log_dir=log_dir,
            env=pipeline.env,
        )
        pipeline.workers.append(provider)
        wait_port(address("aux"), PROVIDER_PORT, "provider", provider, 60)
        yield Cluster(
            folder=folder,
            brokers=brokers,
            postgres=postgres,
            redis=redis,
            proxy=proxy,
            pipeline=pipeline,
        )
