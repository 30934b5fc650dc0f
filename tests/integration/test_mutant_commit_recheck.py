"""The executor's commit-time re-check decides on its own (issue 43, `make mutants`): a call
approved and committed under one policy set is refused at commit when the set in force no
longer permits it, even where nothing else would stop it (an internal write, whose handler
checks nothing of the policy), and a freeze in force at commit time stops an internal write
before its handler runs (no effect check comes after it: the effect is in the transaction).

The TOCTOU test of test_executor.py does not show either alone: its refund is also refused
by the handler's own refundable check, and its freeze comes after the commit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from commands.budgets import load_budget_file
from commands.freezes import NO_FREEZES, FixedFreezes, applied
from commands.limits import load_limit_file
from commands.policy import DEFAULT_POLICY_DIR, SCHEMA_SUFFIX, PolicySet
from commands.reference import catalog
from config.settings import Settings
from executors.claims import ClaimStore
from executors.executor import CommandExecutor
from schemas.envelopes import FreezeRecord, Status
from schemas.errors import ErrorCode
from tests.integration.test_executor import POLICIES, command, scalar

pytestmark = pytest.mark.integration

PAYOUT = {
    "payment_id": "pay_A1001",
    "account_holder": "Ada",
    "account_number": "DE44500105175407324931",
}


def tightened() -> PolicySet:
    """The reference policies with payout accounts forbidden from now on."""
    text = "\n".join(
        f.read_text(encoding="utf-8") for f in sorted(DEFAULT_POLICY_DIR.glob("*.cedar"))
    )
    (schema,) = DEFAULT_POLICY_DIR.glob(f"*{SCHEMA_SUFFIX}")
    forbid = (
        '\n@id("payouts-stopped")\n'
        'forbid (principal, action == Action::"add_payout_account", resource);\n'
    )
    return PolicySet.from_sources(
        text + forbid,
        schema.read_text(encoding="utf-8"),
        load_budget_file(DEFAULT_POLICY_DIR),
        limits=load_limit_file(DEFAULT_POLICY_DIR),
    )


async def payout_rows(pool: AsyncConnectionPool[Any], operation_id: str) -> int:
    return int(
        await scalar(
            pool, "SELECT count(*) FROM payout_accounts WHERE operation_id = %s", operation_id
        )
    )


async def test_a_policy_tightened_after_the_approval_refuses_at_commit(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings
) -> None:
    policies = tightened()
    assert policies.version != POLICIES.version
    payout = command("add_payout_account", PAYOUT, approved=True, roles=("refund",))
    await catalog.start(settings)
    try:
        executor = CommandExecutor(
            pool=pool,
            claims=ClaimStore(redis, prefix=settings.topic_prefix, owner="t-recheck"),
            catalog=catalog,
            policies=policies,
        )
        outcome = (await executor.execute(payout, trace_id=None)).outcome
    finally:
        await catalog.stop()
    assert outcome.status is Status.FAILED, outcome
    assert outcome.error is not None and outcome.error.code is ErrorCode.PRECONDITION_FAILED
    assert await payout_rows(pool, payout.operation_id) == 0


async def test_a_freeze_in_force_at_commit_stops_an_internal_write(
    pool: AsyncConnectionPool[Any], redis: Redis, settings: Settings
) -> None:
    record = FreezeRecord(
        scope="tool:tenant-a:add_payout_account",
        frozen=True,
        by="ops-1",
        reason="incident 43",
        at=datetime.now(UTC),
    )
    payout = command("add_payout_account", PAYOUT, approved=True, roles=("refund",))
    await catalog.start(settings)
    try:
        executor = CommandExecutor(
            pool=pool,
            claims=ClaimStore(redis, prefix=settings.topic_prefix, owner="t-freeze"),
            catalog=catalog,
            policies=POLICIES,
            freezes=FixedFreezes(applied(NO_FREEZES, record)),
        )
        outcome = (await executor.execute(payout, trace_id=None)).outcome
    finally:
        await catalog.stop()
    assert outcome.status is Status.DENIED, outcome
    assert outcome.error is not None and outcome.error.code is ErrorCode.FROZEN
    assert await payout_rows(pool, payout.operation_id) == 0
