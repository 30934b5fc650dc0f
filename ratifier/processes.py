"""Start and stop ratifier worker processes (demo, tests, benchmarks)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if not self.log_file.closed:
            self.log_file.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL at once (crash tests)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if not self.log_file.closed:
            self.log_file.close()


def start_worker(
    command: str, *, name: str, log_dir: Path, env: Mapping[str, str] | None = None
) -> WorkerProcess:
    """Run ``ratifier <command>`` in a child process, output to ``log_dir/<name>.log``."""
    return start_worker_args([command], name=name, log_dir=log_dir, env=env)


# The fake payment provider runs as its own module (test support, never imported here).
FAKE_PROVIDER_MODULE = "testsupport.provider"


def start_worker_args(
    args: list[str],
    *,
    name: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    module: str = "ratifier.cli",
) -> WorkerProcess:
    """Run ``python -m <module> <args…>`` (by default the ``ratifier`` command) in a child
    process, output to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", module, *args],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    return WorkerProcess(name=name, process=process, log_path=log_path, log_file=log_file)


def wait_for_log(worker: WorkerProcess, needle: str, timeout: float) -> bool:
    """Wait until ``needle`` appears in the worker's log, or the worker exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in worker.log_tail(400):
            return True
        if worker.process.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The child gets SIGKILL when its parent dies (Linux), so a launcher killed with -9
    takes its processes with it, as one process would have gone."""
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def run_together(
    commands: Mapping[str, list[str]],
    *,
    env: Mapping[str, Mapping[str, str]] | None = None,
    grace_seconds: float = 30.0,
) -> int:
    """Run ``ratifier <args…>`` for each of ``commands`` as child processes sharing this
    process's output; SIGTERM/SIGINT are passed on; when one child ends, the others are
    stopped (SIGTERM, then SIGKILL after ``grace_seconds``). The first child's exit code that
    is not 0, else 0."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop_all(*_args: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for name, args in commands.items():
            children[name] = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "ratifier.cli", *args],
                env={**os.environ, **((env or {}).get(name) or {})},
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
        code = 0
        while children:
            for name, child in list(children.items()):
                returned = child.poll()
                if returned is None:
                    continue
                del children[name]
                if returned != 0 and code == 0:
                    code = returned
                if not stopping:
                    print(f"ratifier streams: {name} exited ({returned}); stopping the rest")
                    stop_all()
            time.sleep(0.2)
            if stopping:
                deadline = time.monotonic() + grace_seconds
                for child in children.values():
                    try:
                        child.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        child.kill()
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
