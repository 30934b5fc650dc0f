"""Approval-join state size: how big the table (and its compacted changelog) gets.

Runs the join's pure state machine (no brokers): each approval is requested, decided with a
signed statement, committed, and forgotten once its retention passed, on a simulated clock
at ``--rate`` approvals per second. Reports the live table (= the compacted changelog's
live records) at its peak and at the end, and the changelog records written (values and
tombstones) before compaction.

    .venv/bin/python -m bench.approval_state --approvals 1000000 --rate 200

Signing and verifying dominate the run time (about 0.3 ms per approval on one core).
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from approvals.signing import (
    ApprovalKeys,
    local_signing_key,
    verify_decision,
)
from bench.provenance import stamped
from commands.reference import catalog
from schemas.envelopes import Actor, AuthorizedCall
from streams.approval import ApprovalState, Rules, due, on_authorized, on_decided, on_tick
from testsupport.records import authorized_refund, signed_approval

BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))


def _keys() -> ApprovalKeys:
    key = local_signing_key("bench-approval-state-seed-long-enough")
    return ApprovalKeys(
        signing_key=key,
        kid="bench-1",
        algorithm="EdDSA",
        service_keys={"bench-1": (key.public_key(), "EdDSA")},
    )


def _call(n: int, now: datetime) -> AuthorizedCall:
    arguments = {"payment_id": "pay_A1002", "amount_minor": 1 + n % 500, "reason": "bench"}
    return authorized_refund(f"bench-{n:09d}", arguments, now=now)


def run(approvals: int, rate: float) -> dict[str, float]:
    rules = Rules(keys=_keys())
    tool = catalog.get("propose_refund")
    table: dict[str, bytes] = {}
    # The real join's timer scans the table; here a heap of (due time, key) finds the same
    # due states without making the benchmark quadratic.
    timers: list[tuple[datetime, str]] = []
    written = tombstones = written_bytes = 0
    peak_entries = peak_bytes = 0
    live_bytes = 0
    start = datetime(2026, 1, 1, tzinfo=UTC)
    began = time.perf_counter()

    def put(key: str, state: ApprovalState | None) -> None:
        nonlocal written, tombstones, written_bytes, live_bytes
        old = table.pop(key, None)
        live_bytes -= len(old) if old else 0
        if state is None:
            tombstones += 1 if old is not None else 0
            return
        value = state.model_dump_json().encode()
        table[key] = value
        live_bytes += len(value)
        if state.forget_at is not None:
            heapq.heappush(timers, (state.forget_at, key))
        written += 1
        written_bytes += len(value)

    for n in range(approvals):
        now = start + timedelta(seconds=n / rate)
        call = _call(n, now)
        step = on_authorized(None, call, tool=tool, now=now, rules=rules)
        put(call.call_id, step.state)
        record = signed_approval(
            call, rules.keys, approver=BOSS, now=now, validity=rules.keys.decision_validity
        )
        verified = verify_decision(record, kafka_key=call.call_id, keys=rules.keys, now=now)
        step = on_decided(
            step.state, record, verified, call_id=call.call_id, tool=tool, now=now, rules=rules
        )
        put(call.call_id, step.state)
        while timers and timers[0][0] <= now:  # the timer's nudges
            _, key = heapq.heappop(timers)
            raw = table.get(key)
            if raw is not None:
                state = ApprovalState.model_validate_json(raw)
                if due(state, now):
                    put(key, on_tick(state, now=now, rules=rules).state)
        peak_entries = max(peak_entries, len(table))
        peak_bytes = max(peak_bytes, live_bytes)
    return {
        "approvals": approvals,
        "rate_per_s": rate,
        "seconds": time.perf_counter() - began,
        "retention_s": (rules.ttl + timedelta(seconds=rules.keys.leeway_seconds)).total_seconds()
        + rules.retention.total_seconds(),
        "table_entries_end": len(table),
        "table_bytes_end": live_bytes,
        "table_entries_peak": peak_entries,
        "table_bytes_peak": peak_bytes,
        "bytes_per_state": live_bytes / max(len(table), 1),
        "changelog_values_written": written,
        "changelog_tombstones": tombstones,
        "changelog_bytes_written": written_bytes,
    }


RESULT_FILE = Path(__file__).parent / "approval-state-result.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--approvals", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=100.0, help="approvals per second")
    parser.add_argument(
        "--write", action="store_true", help=f"also write {RESULT_FILE.name} (RESULTS.md reads it)"
    )
    args = parser.parse_args()
    result = run(args.approvals, args.rate)
    for name, value in result.items():
        print(f"{name:28} {value:,.1f}")
    if args.write:
        command = (
            f"python -m bench.approval_state --approvals {args.approvals} --rate {args.rate:g}"
        )
        finished = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        RESULT_FILE.write_text(
            json.dumps(stamped({**result, "command": command, "finished": finished}), indent=2)
            + "\n"
        )


if __name__ == "__main__":
    main()
