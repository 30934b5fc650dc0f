"""The partition table: one row per fault, from the chaos history checker's figures."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tests.chaos import expectations

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


# The second table: what each row's load amounted to and whether its fault was seen in force.
EVIDENCE = (
    ("fault", "fault"),
    ("acknowledged (unsent)", "acknowledged"),
    ("provider effects", "provider_effects"),
    ("unexpected outcomes", "unexpected"),
    ("too little", "shortfall"),
    ("fault in force", "in_force"),
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


def render_evidence(rows: Sequence[dict[str, Any]]) -> str:
    """Per row: acknowledged calls (and those never acknowledged), provider effects, calls
    whose answer their kind must never get, minimums missed, and the fault's probes."""
    lines = [
        "| " + " | ".join(title for title, _ in EVIDENCE) + " |",
        "|---|" + "---:|" * (len(EVIDENCE) - 2) + "---|",
    ]
    for row in rows:
        cells = {
            "fault": row.get("fault"),
            "acknowledged": f"{row.get('calls')} ({row.get('unsent')})",
            "provider_effects": row.get("provider_effects"),
            "unexpected": sum(row.get("unexpected_outcomes", {}).values()),
            "shortfall": len(row.get("shortfalls", ())),
            "in_force": "NO" if row.get("fault_error") else row.get("evidence") or "yes",
        }
        lines.append("| " + " | ".join(_cell(cells[key]) for _, key in EVIDENCE) + " |")
    return "\n".join(lines)


def max_pause(times: Sequence[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] with no final answer arriving: the pause an agent
    would have seen (both ends of the window count as edges)."""
    edges = sorted([start, *(t for t in times if start <= t <= end), end])
    return round(max(b - a for a, b in itertools.pairwise(edges)), 1)


def violations(row: dict[str, Any]) -> list[str]:
    """What breaks a guarantee in one row (empty: the row is clean): the chaos suite's checks
    (tests/chaos/expectations.py: guarantees, each call's answer by kind, the minimums), a
    fault that failed or was not seen in force (its probes), the scale-out pause bound."""
    found = expectations.violations(row)
    if row.get("fault_error"):
        found.append(f"the fault failed: {row['fault_error']}")
    bound = row.get("answer_pause_bound_seconds")
    if bound is not None and row.get("max_answer_pause_seconds", 0) > bound:
        found.append(f"answers paused {row['max_answer_pause_seconds']} s > {bound} s")
    return found
