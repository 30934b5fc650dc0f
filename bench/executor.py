"""Executor benchmark: commands/s draining a backlog with the Redis claim fast path and
without it (ledger only), and the cost of one Redis claim next to a plain `SET NX`.

Run: ``make bench-executor`` (or ``.venv/bin/python -m bench.executor``).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from approvals.signing import approval_keys
from bench.common import BenchRun, drain, machine_facts, table
from commands.policy import PolicySet
from config.settings import Settings
from executors.claims import ClaimStore
from ratifier.processes import WorkerProcess
from runtime.clients import redis_client
from schemas.envelopes import ActorRef, AuthorizedCall, CommittedCommand, Effect, Route
from schemas.fingerprint import fingerprint
from schemas.names import Topic
from testsupport.records import approved_command

SECTION = "## Executor"


async def claim_cost(settings: Settings, n: int) -> tuple[float, float]:
    """(µs per claim, µs per plain SET NX), sequential round trips."""
    redis = redis_client(settings)
    claims = ClaimStore(redis, prefix=f"bench{uuid.uuid4().hex[:6]}.", owner="bench")
    try:
        now = int(time.time() * 1000)
        started = time.perf_counter()
        for i in range(n):
            await claims.claim("tenant-a", f"k{i}", "fp", now)
        claim_us = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for _ in range(n):
            await redis.set(f"bench-setnx:{uuid.uuid4().hex}", b"1", nx=True, px=60_000)
        setnx_us = (time.perf_counter() - started) / n * 1e6
        return claim_us, setnx_us
    finally:
        await redis.aclose()


def _reads(
    prefix: str, n: int, payment_id: Callable[[int], str]
) -> list[tuple[str, dict[str, Any]]]:
    """The fields a committed read and an authorized read share, with each one's key: the i-th
    for ``payment_id(i)``, fingerprinted over its own arguments (the executor refuses a command
    whose arguments do not match its fingerprint)."""
    policies = PolicySet.from_directory()
    out = []
    for i in range(n):
        key = f"{prefix}-{uuid.uuid4().hex[:12]}"
        args = {"payment_id": payment_id(i)}
        fields = {
            "operation_id": f"tenant-a:{key}",
            "call_id": f"{key}-{i}",
            "tenant": "tenant-a",
            "actor": ActorRef(sub="bench", roles=("support",)),
            "tool": "get_payment",
            "arguments": args,
            "fingerprint": fingerprint(
                tenant="tenant-a",
                tool="get_payment",
                arguments=args,
                policy_version=policies.version,
            ),
            "effect": Effect.READ,
            "policy_version": policies.version,
        }
        out.append((key, fields))
    return out


def read_commands(
    settings: Settings, n: int, payment_id: Callable[[int], str] = lambda _i: "pay_A1001"
) -> list[bytes]:
    """``n`` committed `get_payment` commands (see :func:`_reads`)."""
    now = datetime.now(UTC)
    return [
        CommittedCommand(**fields, committed_at=now).to_bytes()
        for _key, fields in _reads("b", n, payment_id)
    ]


def write_commands(
    settings: Settings, n: int, payment_id: Callable[[int], str] = lambda _i: "pay_A1001"
) -> list[bytes]:
    """``n`` committed `add_payout_account` commands (an internal reversible write, approved:
    each carries a receipt signed with this deployment's keys), each its own operation, the
    i-th on ``payment_id(i)``: the executor's write path (claim, ledger, re-check, handler)."""
    policies = PolicySet.from_directory()
    keys = approval_keys(settings)
    now = datetime.now(UTC)
    out = []
    for i in range(n):
        key = f"w-{uuid.uuid4().hex[:12]}"
        args = {
            "payment_id": payment_id(i),
            "account_holder": f"Bench {i}",
            "account_number": "DE44500105175407324931",
        }
        command = approved_command(
            "add_payout_account",
            args,
            key=key,
            call_id=f"{key}-{i}",
            effect=Effect.REVERSIBLE_WRITE,
            policy_version=policies.version,
            keys=keys,
            now=now,
            validity=timedelta(hours=1),
            approver="bench-approver",
        )
        out.append(command.to_bytes())
    return out


def join_inputs(
    settings: Settings, n: int, payment_id: Callable[[int], str] = lambda _i: "pay_A1001"
) -> list[bytes]:
    """``n`` auto-routed `calls.authorized` reads that do *not* say the authorizer committed
    them (an older authorizer's records): the approval-join commits each one, which is the
    work it does for an auto call. The authorizer's own output is marked `committed` and only
    skipped by the join, so draining that would measure nothing of the join's work."""
    now = datetime.now(UTC)
    return [
        AuthorizedCall(
            **fields,
            idempotency_key=key,
            route=Route.AUTO,
            proposed_at=now,
            authorized_at=now,
        ).to_bytes()
        for key, fields in _reads("j", n, payment_id)
    ]


async def drain_commands(n: int, *, fast_path: bool) -> float:
    run = BenchRun.create("executor-redis" if fast_path else "executor-ledger")
    t = run.settings.topic

    def executor() -> list[WorkerProcess]:
        flag = "true" if fast_path else "false"
        return [run.start("executor", "executor", RATIFIER_EXECUTOR__REDIS_FAST_PATH=flag)]

    try:
        await run.prepare()
        rate, _ = await drain(
            run,
            executor,
            t(Topic.COMMITTED),
            t(Topic.OUTCOMES),
            n,
            read_commands(run.settings, n),
            600,
        )
        return rate
    finally:
        await run.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    settings = Settings()
    claim_us, setnx_us = asyncio.run(claim_cost(settings, 5000))
    print(f"claim {claim_us:.0f} µs, SET NX {setnx_us:.0f} µs", flush=True)
    without = asyncio.run(drain_commands(n, fast_path=False))
    with_dedup = asyncio.run(drain_commands(n, fast_path=True))
    print(f"executor: ledger only {without:,.0f}/s, with Redis claims {with_dedup:,.0f}/s")
    section = "\n".join(
        [
            SECTION,
            "",
            f"Command: `.venv/bin/python -m bench.executor {n}` — {machine_facts()}.",
            "",
            table(
                [
                    [
                        "B4 redis-py asyncio `SET NX` (one round trip)",
                        f"{setnx_us:.0f} µs",
                        "baseline",
                    ],
                    [
                        "Redis claim (Lua: fingerprint, owner, lease, fencing number)",
                        f"{claim_us:.0f} µs",
                        f"{claim_us / setnx_us:.2f} x SET NX",
                    ],
                    [
                        "executor, one process, read commands, ledger only "
                        "(`RATIFIER_EXECUTOR__REDIS_FAST_PATH=false`)",
                        f"{without:,.0f} commands/s",
                        "baseline",
                    ],
                    [
                        "executor, one process, read commands, Redis claim + ledger",
                        f"{with_dedup:,.0f} commands/s",
                        f"{with_dedup / without:.0%} of ledger only",
                    ],
                ],
                ["what", "measured", "note"],
            ),
            "",
            "Each command: claim, one PostgreSQL transaction (ledger insert, tenant-scoped "
            "`FOR UPDATE` re-read, Cedar re-check, handler, outcome, audit row), outcome published "
            "with acks=all, offsets committed per batch.",
            "",
        ]
    )
    print(section)  # `make bench` writes bench/RESULTS.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
