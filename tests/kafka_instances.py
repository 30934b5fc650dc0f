"""Private Kafka instances for tests: `deploy/local/kafka-cluster` started under a throw-away
state directory and on free ports, so a test can kill, restart and wipe its brokers while the
shared broker on 127.0.0.1:9092 keeps serving the other tests."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "deploy" / "local" / "kafka-cluster"
# The jars `deploy/local/up` fetched for the shared broker (never downloaded again here).
DEFAULT_JARS = Path(
    os.environ.get(
        "RATIFIER_KAFKA_JARS_DIR",
        Path(os.environ.get("RATIFIER_LOCAL_HOME", Path.home() / ".cache" / "ratifier-local"))
        / "kafka-jars"
        / os.environ.get("RATIFIER_KAFKA_VERSION", "4.4.0"),
    )
)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_base(brokers: int) -> int:
    """A base whose client (base..) and controller (base+10..) ports are all free."""
    for _ in range(200):
        base = random.randrange(20000, 32000, 20)  # below the ephemeral range
        if all(_free(base + i) and _free(base + 10 + i) for i in range(brokers)):
            return base
    raise RuntimeError("no free port range for a private Kafka instance")


@dataclass
class KafkaInstance:
    name: str
    brokers: int
    sasl: bool = False
    port_base: int = 0
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ratifier-kafka-")))
    startup_log: str = ""

    @property
    def dir(self) -> Path:
        return self.home / "kafka-instances" / self.name

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port(i)}" for i in range(1, self.brokers + 1))

    @property
    def ca_file(self) -> Path:
        return self.dir / "tls" / "ca.pem"

    def port(self, node: int) -> int:
        return self.port_base + node - 1

    def node_for_port(self, port: int) -> int:
        return port - self.port_base + 1

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RATIFIER_LOCAL_HOME": str(self.home),
            "RATIFIER_KAFKA_JARS_DIR": str(DEFAULT_JARS),
            "RATIFIER_KAFKA_INSTANCE": self.name,
            "RATIFIER_KAFKA_BROKERS": str(self.brokers),
            "RATIFIER_KAFKA_SASL": "1" if self.sasl else "0",
            "RATIFIER_KAFKA_PORT_BASE": str(self.port_base),
            "RATIFIER_STOP_WAIT": "15",
        }

    def script(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [str(SCRIPT), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"kafka-cluster {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def up(self) -> float:
        """Start (or restart the missing nodes of) the instance; seconds until all answer."""
        if not self.port_base:
            self.port_base = free_port_base(self.brokers)
        started = time.monotonic()
        self.startup_log = self.script("up")
        return time.monotonic() - started

    def pid(self, node: int) -> int:
        return int((self.dir / "run" / f"node-{node}.pid").read_text().split()[0])

    def kill9(self, node: int) -> None:
        """SIGKILL one node, as a crashed machine would go (no clean shutdown)."""
        pid = self.pid(node)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace").split()
            if len(stat) > 2 and stat[2] == "Z":
                break
            time.sleep(0.05)

    def down(self) -> None:
        """Stop every node and delete the instance's state (never the shared broker's)."""
        try:
            self.script("down", "--wipe", timeout=120)
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
