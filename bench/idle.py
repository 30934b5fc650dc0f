"""T5: the first call after a long idle. ``make bench-idle`` runs the true case (the
pipeline sits idle for 30 minutes, then one read call); ``make bench`` runs a short variant
that forces the state a long idle leaves behind (every TCP connection of the workers
closed by the far end, as the broker's ``connections.max.idle.ms``, the client's
``connections_max_idle_ms`` and NAT/firewall idle timers do) without waiting for it.

Result of the true run: ``bench/idle-result.json``, stamped with the id of the `make bench`
run in bench/results.json and its own commit, date and host; bench/RESULTS.md shows it, as a
separate run, only beside that run (bench.provenance).
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BenchRun, OutcomeWatcher, Proposer, agent_token, machine_facts
from bench.provenance import stamped

RESULT_FILE = Path(__file__).parent / "idle-result.json"


def worker_sockets(pids: list[int]) -> list[tuple[str, str]]:
    """(local, peer) of the established TCP connections owned by ``pids``."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=False
    ).stdout
    found = []
    for line in out.splitlines():
        if not any(f"pid={pid}," in line for pid in pids):
            continue
        parts = line.split()
        local, peer = parts[2], parts[3]
        found.append((local, peer))
    return found


def reap_connections(pids: list[int]) -> tuple[int, str]:
    """Close the workers' TCP connections the way an idle reaper does (the kernel sends
    the RST: `ss -K`). Only the sockets of our own worker processes, selected by their
    local port. Returns (closed, note)."""
    sockets = worker_sockets(pids)
    closed = 0
    for local, peer in sockets:
        lport = local.rsplit(":", 1)[1]
        pport = peer.rsplit(":", 1)[1]
        done = subprocess.run(
            [
                "ss",
                "-K",
                "-tnH",
                "state",
                "established",
                f"( sport = :{lport} and dport = :{pport} )",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            closed += 1
    note = f"{closed} of {len(sockets)} worker connections closed with `ss -K`"
    return closed, note


async def one_call(
    proposer: Proposer, watcher: OutcomeWatcher, timeout: float = 60, call_id: str | None = None
) -> dict[str, float] | None:
    call_id = call_id or f"idle-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    fut = await proposer.propose(call_id)
    await fut
    if not await watcher.wait([call_id], timeout):
        return None
    outcome = watcher.ended[call_id]
    return {
        "outcome_ms": (outcome.at - outcome.proposed_at) * 1000,
        "client_ms": (outcome.seen - started) * 1000,
    }


async def wait_ready(proposer: Proposer, watcher: OutcomeWatcher, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await one_call(proposer, watcher, timeout=15) is not None:
            return True
    return False


async def first_call_after_idle(
    run: BenchRun, idle_seconds: float, *, reap: bool, progress: Any = print
) -> dict[str, Any]:
    """Start streams + executor, measure warm calls, idle, then the first call."""
    await run.prepare()
    streams = run.start("streams", "idle-streams")
    executor = run.start("executor", "idle-executor")
    watcher = OutcomeWatcher(run.settings)
    await watcher.start()
    proposer = Proposer(run.settings, watcher, agent_token(run.settings))
    await proposer.start()
    result: dict[str, Any] = {"idle_seconds": idle_seconds, "reaped": reap}
    try:
        if not await wait_ready(proposer, watcher, timeout=180):
            result["error"] = "pipeline not ready in 180 s"
            return result
        warm = []
        for _ in range(20):
            sample = await one_call(proposer, watcher)
            if sample:
                warm.append(sample["outcome_ms"])
        result["warm_p50_ms"] = statistics.median(warm) if warm else None
        progress(f"  warm call p50 {result['warm_p50_ms']:.1f} ms; idling {idle_seconds:.0f} s")
        # The bench's own clients idle too: their connections are reaped like the workers'.
        await asyncio.sleep(idle_seconds)
        if reap:
            _closed, note = reap_connections([streams.process.pid, executor.process.pid])
            result["reap"] = note
            progress(f"  {note}")
        first = await one_call(proposer, watcher, timeout=120)
        second = await one_call(proposer, watcher, timeout=60)
        result["first"] = first
        result["second"] = second
        result["alive"] = streams.process.poll() is None and executor.process.poll() is None
        return result
    finally:
        await proposer.stop()
        await watcher.stop()
        await run.close()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 1800.0
    command = f".venv/bin/python -m bench.idle {idle:.0f}"
    print(f"bench-idle: {idle:.0f} s idle, then one read call ({datetime.now(UTC):%H:%M} UTC)")
    started = datetime.now(UTC)
    run = BenchRun.create("idle")
    result = asyncio.run(first_call_after_idle(run, idle, reap=False))
    result.update(
        {
            "command": command,
            "started": started.isoformat(timespec="seconds"),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine_facts(),
        }
    )
    # With the id of the run in bench/results.json: RESULTS.md shows it with that run only.
    result = stamped(result)
    RESULT_FILE.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0 if result.get("first") else 1


if __name__ == "__main__":
    raise SystemExit(main())
