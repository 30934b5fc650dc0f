"""The partition table: one row per fault, from the chaos history checker's figures."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

COLUMNS = (
    ("fault", "fault"),
    ("calls", "calls"),
    ("lost", "lost"),
    ("duplicates", "duplicate_effects"),
    ("two finals", "two_final_outcomes"),
    ("effects = ledger", "effects_equal_ledger"),
    ("recovery (s)", "recovery_seconds"),
    ("max latency (s)", "max_latency_seconds"),
    ("max answer pause (s)", "max_answer_pause_seconds"),
    ("commit lag", "commit_lag_total"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "never"  # a call in flight at the fault's end never got its final outcome
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def render(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table (it goes into docs/reliability.md as printed)."""
    lines = [
        "| " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(_cell(row.get(key)) for _, key in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def max_pause(times: Sequence[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] with no final answer arriving: the pause an agent
    would have seen (both ends of the window count as edges)."""
    edges = sorted([start, *(t for t in times if start <= t <= end), end])
    return round(max(b - a for a, b in itertools.pairwise(edges)), 1)


def violations(row: dict[str, Any]) -> list[str]:
    """What breaks a guarantee in one row (empty: the row is clean)."""
    found = [
        f"{key}={row[key]}"
        for key in ("lost", "duplicate_effects", "two_final_outcomes", "history_problems")
        if row.get(key)
    ]
    if not row.get("effects_equal_ledger", False):
        found.append("provider effects differ from the ledger")
    if any(row.get("streams_commit_lag", {}).values()):
        found.append(f"consumer lag {row['streams_commit_lag']}")
    if row.get("fault_error"):
        found.append(f"the fault failed: {row['fault_error']}")
    bound = row.get("answer_pause_bound_seconds")
    if bound is not None and row.get("max_answer_pause_seconds", 0) > bound:
        found.append(f"answers paused {row['max_answer_pause_seconds']} s > {bound} s")
    return found
