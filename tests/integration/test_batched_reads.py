"""The plain reads of a poll batch run together (executors/reads.py, docs/execution.md
"Reads"): one transaction for the batch, each read with its own outcome and audit row, one
read's failure never another's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from aiokafka import ConsumerRecord
from psycopg_pool import AsyncConnectionPool

from approvals.signing import approval_keys
from commands.catalog import Catalog, ExecutionContext, HandlerResult, Tool
from commands.payments.handlers import read_resource
from commands.payments.loaders import load_payment, load_payments
from commands.payments.models import GetPaymentArguments, PaymentFacts
from commands.policy import PolicySet
from commands.reference import catalog
from config.settings import Settings
from executors.executor import CommandExecutor
from executors.reads import BatchedReads, Read
from executors.service import ExecutorService
from feeds.policies import PolicyFeed
from schemas.envelopes import ActorRef, CommittedCommand, Effect, Outcome
from schemas.errors import StorageUnavailable
from schemas.fingerprint import fingerprint as fingerprint_of
from tests.services import session_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

POLICIES = PolicySet.from_directory()
PER_TENANT = 25


def read(
    payment_id: str, *, tenant: str = "tenant-a", fingerprint: str | None = None
) -> CommittedCommand:
    arguments = {"payment_id": payment_id}
    key = f"r-{uuid.uuid4().hex[:12]}"
    return CommittedCommand(
        operation_id=f"{tenant}:{key}",
        call_id=f"c-{uuid.uuid4().hex[:12]}",
        tenant=tenant,
        actor=ActorRef(sub="agent-1", roles=("support",)),
        tool="get_payment",
        arguments=arguments,
        fingerprint=fingerprint
        or fingerprint_of(
            tenant=tenant,
            tool="get_payment",
            arguments=arguments,
            policy_version=POLICIES.version,
        ),
        effect=Effect.READ,
        policy_version=POLICIES.version,
        committed_at=datetime.now(UTC),
    )


def payment_ids(tenant: str) -> list[str]:
    letter = "A" if tenant == "tenant-a" else "B"
    return [f"pay_{letter}R{n:03d}" for n in range(PER_TENANT)]


async def seed(pool: AsyncConnectionPool[Any]) -> None:
    async with pool.connection() as conn:
        for tenant in ("tenant-a", "tenant-b"):
            for n, payment in enumerate(payment_ids(tenant)):
                await conn.execute(
                    "INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, "
                    "currency, refundable_minor, status) VALUES (%s, %s, 'r@example.com', %s, "
                    "'EUR', 0, 'captured') ON CONFLICT (tenant, payment_id) DO UPDATE SET "
                    "amount_minor = EXCLUDED.amount_minor",
                    (tenant, payment, 1000 + n),
                )


async def audit_rows(pool: AsyncConnectionPool[Any], call_ids: list[str]) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT call_id, tenant, kind, detail, xmin::text AS xact FROM audit_log "
            "WHERE call_id = ANY(%s)",
            (call_ids,),
        )
        return list(await cur.fetchall())


def the_batch() -> tuple[list[CommittedCommand], dict[str, str]]:
    """50 reads over two tenants, plus a missing payment, a tampered fingerprint (refused at
    the re-check), a foreign payment and a cancelled call; and the code each must end with."""
    good = [read(p, tenant=t) for t in ("tenant-a", "tenant-b") for p in payment_ids(t)]
    missing = read("pay_AR999")
    tampered = read("pay_AR001", fingerprint="0" * 64)
    foreign = read("pay_BR001", tenant="tenant-a")  # tenant-b's id, asked in tenant-a
    cancelled = read("pay_AR002")
    expected = {c.call_id: "" for c in good} | {
        missing.call_id: "not_found",
        tampered.call_id: "precondition_failed",
        foreign.call_id: "not_found",
        cancelled.call_id: "cancelled",
    }
    return [*good, missing, tampered, foreign, cancelled], expected


def check_outcome(command: CommittedCommand, outcome: dict[str, Any], code: str) -> None:
    assert outcome["tenant"] == command.tenant
    assert outcome["operation_id"] == command.operation_id
    if code:
        assert outcome["error"]["code"] == code, outcome
        assert outcome["result"] is None
    else:
        assert outcome["status"] == "succeeded", outcome
        assert outcome["result"]["id"] == command.arguments["payment_id"]
        letter_index = int(command.arguments["payment_id"][-3:])
        assert outcome["result"]["amount_minor"] == 1000 + letter_index


async def test_fifty_reads_of_two_tenants_one_transaction_each_its_own_outcome(
    pool: AsyncConnectionPool[Any],
) -> None:
    """The executor service's batch handler on one batch of 50 reads over two tenants plus a
    missing payment, a tampered fingerprint (refused at the re-check), a foreign payment and
    a cancelled call: one transaction, and each call its own outcome and `read` audit row."""
    await seed(pool)
    commands, expected = the_batch()
    cancelled = commands[-1]
    records = [consumed(c, i) for i, c in enumerate(commands)]
    handled, reads = await handle(pool, catalog, records, cancelled=frozenset({cancelled.call_id}))

    assert reads.transactions == 1
    for command, result in zip(commands, handled, strict=True):
        outcome = outcome_of(result)
        assert outcome.call_id == command.call_id
        check_outcome(command, outcome.model_dump(mode="json"), expected[command.call_id])
    rows = await audit_rows(pool, list(expected))
    assert sorted(r["call_id"] for r in rows) == sorted(expected)
    by_call = {r["call_id"]: r for r in rows}
    for command in commands:
        row = by_call[command.call_id]
        assert row["kind"] == "read" and row["tenant"] == command.tenant
        assert (row["detail"]["code"] or "") == expected[command.call_id]
    # Every audit row of the batch was written by one transaction (the old path: 54).
    assert len({r["xact"] for r in rows}) == 1
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM command_ledger WHERE operation_id = ANY(%s)",
            ([c.operation_id for c in commands],),
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == 0  # reads never write the ledger


def consumed(command: CommittedCommand | None, offset: int) -> ConsumerRecord[bytes, bytes]:
    value = command.to_bytes() if command is not None else b"{not json"
    return ConsumerRecord(
        topic="t.commands.committed",
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"k",
        value=value,
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=len(value),
        headers=(),
    )


def fragile_catalog(breaks_on: str) -> Catalog:
    """get_payment whose handler hits a database error on one payment: the error aborts the
    shared transaction of a batch, which then must not cost the other reads anything."""

    async def handler(ctx: ExecutionContext) -> HandlerResult:
        assert ctx.resource is not None
        if ctx.resource.id == breaks_on:
            await ctx.conn.execute("SELECT 1 / 0")
        return await read_resource(ctx)

    return Catalog(
        [
            Tool(
                name="get_payment",
                description="d",
                arguments=GetPaymentArguments,
                effect=Effect.READ,
                load=load_payment,
                load_many=load_payments,
                resource=PaymentFacts,
                handler=handler,
            )
        ]
    )


async def handle(
    pool: AsyncConnectionPool[Any],
    tools: Catalog,
    records: list[ConsumerRecord[bytes, bytes]],
    cancelled: frozenset[str] = frozenset(),
) -> tuple[list[Any], BatchedReads]:
    settings = session_settings()
    keys = approval_keys(settings)
    service = ExecutorService(settings, catalog=tools, policies=PolicyFeed(settings, POLICIES))
    executor = CommandExecutor(
        pool=pool, claims=None, catalog=tools, policies=POLICIES, receipt_keys=keys
    )
    reads = BatchedReads(
        pool=pool, catalog=tools, policies=POLICIES, receipt_keys=keys, cancelled=cancelled
    )
    handled = await service._handle_batch(records, executor=executor, reads=reads, pool=pool)
    return list(handled), reads


def outcome_of(handled: Any) -> Outcome:
    (emit,) = handled.emits
    assert isinstance(emit.value, Outcome)
    return emit.value


async def test_a_handler_database_error_falls_back_to_one_by_one(
    pool: AsyncConnectionPool[Any],
) -> None:
    await seed(pool)
    good = [read(p) for p in payment_ids("tenant-a")[:5]]
    broken = read("pay_AR007")
    records = [consumed(c, i) for i, c in enumerate([*good, broken])]
    records.append(consumed(None, len(records)))  # unreadable: dead-lettered as before

    handled, reads = await handle(pool, fragile_catalog("pay_AR007"), records)

    assert reads.transactions == 0  # the batch rolled back; the reads ran alone
    for command, result in zip([*good, broken], handled, strict=False):
        outcome = outcome_of(result)
        assert outcome.call_id == command.call_id
        if command is broken:
            assert outcome.error is not None and outcome.error.code.value == "permanent_error"
        else:
            assert outcome.status.value == "succeeded"
    assert handled[-1].failure == "unreadable committed command"
    rows = await audit_rows(pool, [c.call_id for c in [*good, broken]])
    assert sorted(r["call_id"] for r in rows) == sorted(c.call_id for c in [*good, broken])


async def test_a_batch_counts_one_transaction(pool: AsyncConnectionPool[Any]) -> None:
    await seed(pool)
    commands = [read(p) for p in payment_ids("tenant-a")[:10]] + [read("pay_AR999")]
    handled, reads = await handle(pool, catalog, [consumed(c, i) for i, c in enumerate(commands)])
    assert reads.transactions == 1
    outcomes = [outcome_of(h) for h in handled]
    assert [o.call_id for o in outcomes] == [c.call_id for c in commands]
    assert [o.status.value for o in outcomes] == ["succeeded"] * 10 + ["failed"]
    rows = await audit_rows(pool, [c.call_id for c in commands])
    assert len(rows) == len(commands) and len({r["xact"] for r in rows}) == 1


async def test_storage_error_is_not_a_reads_fault(pool: AsyncConnectionPool[Any]) -> None:
    """A connection lost inside the batch's transaction is StorageUnavailable (the service
    retries the batch), never an outcome."""

    async def lost(ctx: ExecutionContext) -> HandlerResult:
        raise psycopg.OperationalError("connection lost")

    tools = Catalog(
        [
            Tool(
                name="get_payment",
                description="d",
                arguments=GetPaymentArguments,
                effect=Effect.READ,
                load=load_payment,
                load_many=load_payments,
                resource=PaymentFacts,
                handler=lost,
            )
        ]
    )
    reads = BatchedReads(
        pool=pool, catalog=tools, policies=POLICIES, receipt_keys=approval_keys(Settings())
    )
    command = read("pay_AR001")
    with pytest.raises(StorageUnavailable):
        await reads.execute([Read(command=command, trace_id=None)])
    assert reads.transactions == 0
    assert await audit_rows(pool, [command.call_id]) == []
