"""Private dependencies for tests that take one away under a running process, never the shared
services other sessions use: a throwaway PostgreSQL cluster (its own data folder and port;
Debian's server binaries, run as the `postgres` user when we are root, as initdb refuses
root), a throwaway single-node Kafka (the jars `deploy/local/up` downloaded), and a forwarder
standing for a broker address that is unreachable until started."""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.e2e.conftest import free_port


def server_binaries() -> Path | None:
    """The newest PostgreSQL server's bin folder, or None when none is installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: p.parts[-3])
    return found[-1].parent if found else None


@dataclass
class PrivatePostgres:
    bin_dir: Path
    folder: Path
    port: int
    as_user: list[str]

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql://ratifier:ratifier@127.0.0.1:{self.port}/ratifier"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def crash(self) -> None:
        """Stop at once, as a crash or a hard restart would: every connection is cut."""
        self._ctl("-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")


def initdb(bin_dir: Path, data: Path, as_user: Sequence[str], timeout: float = 180) -> None:
    """A new PostgreSQL cluster in ``data`` (superuser postgres, trust, UTF8)."""
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
        timeout=timeout,
    )


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A fresh cluster with the `ratifier` role and database, started; removed afterwards."""
    bin_dir = server_binaries()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    folder = Path(tempfile.mkdtemp(prefix="ratifier-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    server = PrivatePostgres(bin_dir=bin_dir, folder=folder, port=free_port(), as_user=as_user)
    try:
        initdb(bin_dir, server.data, as_user, timeout=120)
        server.start()
        admin = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE ratifier LOGIN PASSWORD 'ratifier'")
            conn.execute("CREATE DATABASE ratifier OWNER ratifier")
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()  # unless already stopped (or never started)
        shutil.rmtree(folder, ignore_errors=True)


class Forwarder:
    """A TCP forwarder from a local port to ``target``, started when a test says the
    dependency is back (before that, nothing listens: connections are refused)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self._target = target
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        server.settimeout(0.2)
        self._server = server
        threading.Thread(target=self._accept, daemon=True).start()

    def _keep(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed.is_set():
                sock.close()
                return False
            self._sockets.append(sock)
            return True

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._keep(client):
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                continue  # the client sees its connection closed when we close
            if not self._keep(upstream):
                return
            upstream.settimeout(None)
            client.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            if self._server is not None:
                self._server.close()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()


REPO = Path(__file__).resolve().parents[2]


def kafka_replication(replicas: int, min_isr: int, internal_partitions: int) -> str:
    """Broker settings: how the pipeline's topics and Kafka's own are replicated, and the
    small test broker's tuning (no topic made on first use, no rebalance delay)."""
    return f"""\
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions={internal_partitions}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions={internal_partitions}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
"""


KAFKA_SETTINGS = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
""" + kafka_replication(replicas=1, min_isr=1, internal_partitions=4)


def kafka_jars() -> Path | None:
    """The jars `deploy/local/up` downloaded (the shared broker runs from them), or None."""
    configured = os.environ.get("RATIFIER_KAFKA_JARS_DIR")
    if configured:
        return Path(configured) if Path(configured).is_dir() else None
    found = sorted((Path.home() / ".cache/ratifier-local/kafka-jars").glob("*/"))
    return found[-1] if found and shutil.which("java") else None


def kafka_java(jars: Path, logs: Path, *args: str, jvm: Sequence[str] = ("-Xmx512m",)) -> list[str]:
    """The command line of a Kafka tool or broker (``args``: main class and its arguments)
    from the local jars, logging to ``logs``."""
    return [
        "java",
        "-Xms128m",
        *jvm,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={REPO / 'deploy/local/kafka-log4j2.xml'}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        f"{jars}/*",
        *args,
    ]


def kafka_cluster_id() -> str:
    """A new KRaft cluster id."""
    cluster = "-"
    while cluster.startswith("-"):  # StorageTool would read "-…" as an option
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster


@dataclass
class PrivateKafka:
    jars: Path
    folder: Path
    port: int
    controller_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, *args: str) -> list[str]:
        return kafka_java(self.jars, self.folder, *args)

    def format(self) -> None:
        props = self.folder / "server.properties"
        props.write_text(
            KAFKA_SETTINGS.format(
                port=self.port, controller=self.controller_port, data=self.folder / "data"
            )
        )
        subprocess.run(
            self._java(
                "kafka.tools.StorageTool", "format", "-t", kafka_cluster_id(), "-c", str(props)
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        """Start the broker (again, on the same data) and wait until it accepts clients."""
        with (self.folder / "kafka.out").open("ab") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.folder / "server.properties")),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while True:
            assert self.process.poll() is None, (self.folder / "kafka.out").read_text()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                assert time.monotonic() < deadline, "private Kafka did not start"
                time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: every connection cut, nothing flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@contextmanager
def private_kafka() -> Iterator[PrivateKafka]:
    """A single-node KRaft broker on free ports and a temporary folder; removed afterwards."""
    jars = kafka_jars()
    if jars is None:
        raise RuntimeError("no Kafka jars (deploy/local/up downloads them) or no java")
    folder = Path(tempfile.mkdtemp(prefix="ratifier-kafka-"))
    broker = PrivateKafka(jars=jars, folder=folder, port=free_port(), controller_port=free_port())
    try:
        broker.format()
        broker.start()
        yield broker
    finally:
        broker.kill()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A throwaway redis-server on a free port and its own folder (append-only file on, so a
    restart keeps what it had; FLUSHALL is the data-loss experiment)."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with (self.folder / "redis.out").open("ab") as out:
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.folder),
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, (self.folder / "redis.out").read_text()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "private Redis did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM: redis-server flushes its append-only file and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server on a free port and a temporary folder, started; removed afterwards."""
    if redis_server_binary() is None:
        raise RuntimeError("no redis-server installed")
    folder = Path(tempfile.mkdtemp(prefix="ratifier-redis-"))
    server = PrivateRedis(folder=folder, port=free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def required(found: Path | None, what: str) -> Path:
    """A private service's binaries, which `make up` installs: missing ones fail the test
    with what to do, instead of skipping it (a skipped real-service test checks nothing)."""
    if found is None:
        pytest.fail(f"{what} not found: run `make up` (deploy/local/up installs it)")
    return found
