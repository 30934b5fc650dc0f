"""Which run a figure belongs to.

`make bench` gives each run an id (``run_id`` in bench/results.json). Every figure of
bench/RESULTS.md comes from that run's values, or from a result file that a separate command
(`make bench-idle`, `make bench-approvals`, `make bench-replies`, `make bench-operators`)
wrote *with* that run: such a command stamps its file with the id of the run in
bench/results.json at the time (:func:`stamped`) and with its own commit, date and host, and
the report shows the file only when its id is the run's (:func:`not_this_run`). A file left
behind by an earlier run, written before run ids existed, or missing, is shown as "—" with
the reason, never as this run's figures.
"""

from __future__ import annotations

import json
import platform
import subprocess
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

VALUES = Path(__file__).parent / "results.json"


def new_run_id(now: datetime | None = None) -> str:
    """A run's id: its start (UTC, to the second) and a random suffix."""
    return f"{(now or datetime.now(UTC)):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def current_run_id(path: Path = VALUES) -> str | None:
    """The id of the run whose results are in ``path`` (None: no results, or from before run
    ids)."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))["values"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = values.get("run_id") if isinstance(values, dict) else None
    return found if isinstance(found, str) and found else None


def git_commit() -> str:
    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = sh("git", "rev-parse", "--short", "HEAD") or "?"
    return commit + (" (dirty)" if sh("git", "status", "--porcelain") else "")


def stamped(result: Mapping[str, Any], run_id: str | None = None) -> dict[str, Any]:
    """``result`` with the run it was measured with (the id in bench/results.json unless
    given) and its own commit, date and host."""
    return {
        **result,
        "run_id": run_id if run_id is not None else current_run_id(),
        "commit": git_commit(),
        "host": platform.node() or "?",
        "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def origin(result: Mapping[str, Any]) -> str:
    """Where and when a result file was measured: its commit, date and host (what it
    recorded of them)."""
    written = result.get("written") or result.get("finished") or "date not recorded"
    commit = f"commit {result['commit']}" if result.get("commit") else "commit not recorded"
    host = f"host {result['host']}" if result.get("host") else "host not recorded"
    return f"{written}, {commit}, {host}"


def not_this_run(
    result: Mapping[str, Any] | None, run_id: str | None, *, file: str, command: str
) -> str | None:
    """None when ``result`` (a result file's content; None: missing or unreadable) was
    measured with run ``run_id``; otherwise why it is not shown, and what to run."""
    again = f"run `{command}` after `make bench`"
    if result is None:
        return f"not measured with this run ({file} is missing): {again}"
    if run_id is None:
        return f"this run has no run id, so {file} cannot be told to be its own: {again}"
    theirs = result.get("run_id")
    if not theirs:
        return (
            f"{file} ({origin(result)}) carries no run id: it was not measured with this run; "
            f"{again}"
        )
    if theirs != run_id:
        return (
            f"{file} ({origin(result)}) belongs to run {theirs}, not to this run ({run_id}); "
            f"{again}"
        )
    return None


def read_result(path: Path) -> dict[str, Any] | None:
    """A result file's content (None: missing or unreadable)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return dict(found) if isinstance(found, dict) else None
