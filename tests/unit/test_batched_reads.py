"""The batched read path's pure parts: which records of a batch run together, how their
loads are grouped, the shared commit-time re-check, and one read's failure staying its own
(executors/reads.py, docs/execution.md "Reads")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from approvals.signing import approval_keys
from commands.catalog import (
    Catalog,
    Connection,
    ExecutionContext,
    HandlerResult,
    Resource,
    Tool,
    load_groups,
)
from commands.payments.models import GetPaymentArguments, PaymentFacts
from commands.policy import PolicySet
from config.settings import Settings
from executors.decisions import Admitted, Loaded, admission, plain_read, resource_refusals
from executors.reads import BatchedReads, Read, split_reads
from schemas.envelopes import Actor, ActorRef, CommittedCommand, Effect, Status
from schemas.errors import ErrorCode, PreconditionFailed
from schemas.fingerprint import fingerprint
from tests.unit.conftest import NOW, PAYMENT_ATTRS

KEYS = approval_keys(Settings())


def read(
    payment_id: str = "pay_A1001",
    *,
    tenant: str = "tenant-a",
    tool: str = "get_payment",
    effect: Effect = Effect.READ,
    call_id: str = "c-1",
    policy_version: str = "p1",
    fp: str | None = None,
) -> CommittedCommand:
    arguments = {"payment_id": payment_id}
    return CommittedCommand(
        operation_id=f"{tenant}:k-{call_id}",
        call_id=call_id,
        tenant=tenant,
        actor=ActorRef(sub="agent-1", roles=("support",)),
        tool=tool,
        arguments=arguments,
        fingerprint=fp
        or fingerprint(
            tenant=tenant, tool=tool, arguments=arguments, policy_version=policy_version
        ),
        effect=effect,
        policy_version=policy_version,
        committed_at=NOW,
    )


def refund(call_id: str = "w-1") -> CommittedCommand:
    arguments = {"payment_id": "pay_A1001", "amount_minor": 1, "reason": "r"}
    return CommittedCommand(
        operation_id=f"tenant-a:k-{call_id}",
        call_id=call_id,
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=("refund",)),
        tool="propose_refund",
        arguments=arguments,
        fingerprint=fingerprint(
            tenant="tenant-a", tool="propose_refund", arguments=arguments, policy_version="p1"
        ),
        effect=Effect.EXTERNAL_WRITE,
        policy_version="p1",
        committed_at=NOW,
    )


def test_only_plain_reads_are_batched(catalog: Catalog) -> None:
    commands: list[CommittedCommand | None] = [
        read(call_id="r-1"),
        refund(),
        None,  # unreadable record: answered on the per-record path, as before
        read(call_id="r-2", tool="get_refund_policy"),
        # The command says read, the catalog says write: not a read (the ledger path decides).
        read(call_id="r-3", tool="propose_refund"),
        read(call_id="r-4", tool="no_such_tool"),
        read(call_id="r-5", tenant="tenant-b", payment_id="pay_B2001"),
    ]
    reads, rest = split_reads(commands, catalog)
    assert reads == [0, 3, 6]
    assert rest == [1, 2, 4, 5]
    # The same test as CommandExecutor.execute's.
    assert plain_read(read(), catalog.get("get_payment"))
    assert not plain_read(read(effect=Effect.EXTERNAL_WRITE), catalog.get("get_payment"))
    assert not plain_read(read(), None)


def test_loads_grouped_per_tenant_and_tool_in_order() -> None:
    keys = [
        ("tenant-a", "get_payment"),
        ("tenant-b", "get_payment"),
        ("tenant-a", "get_refund_policy"),
        ("tenant-a", "get_payment"),
        ("tenant-b", "get_payment"),
    ]
    assert load_groups(keys) == {
        ("tenant-a", "get_payment"): [0, 3],
        ("tenant-b", "get_payment"): [1, 4],
        ("tenant-a", "get_refund_policy"): [2],
    }
    assert load_groups([]) == {}


def test_admission_is_the_recheck_before_the_load(catalog: Catalog) -> None:
    tool = catalog.get("get_payment")
    assert tool is not None

    def admit(c: CommittedCommand, cancelled: frozenset[str] = frozenset()) -> Any:
        return admission(c, tool, cancelled=cancelled, now=NOW, keys=KEYS)

    ok = admit(read())
    assert isinstance(ok, Admitted)
    assert ok.actor == Actor(sub="agent-1", tenant="tenant-a", roles=("support",))
    assert isinstance(ok.arguments, GetPaymentArguments)
    assert admit(read(call_id="gone"), frozenset({"gone"})) is ErrorCode.CANCELLED
    assert admit(read(fp="0" * 64)) is ErrorCode.PRECONDITION_FAILED
    assert admit(read("not-a-payment-id")) is ErrorCode.INVALID_ARGUMENTS


def test_resource_refusals_one_evaluation_for_many(catalog: Catalog, policies: PolicySet) -> None:
    tool = catalog.get("get_payment")
    assert tool is not None

    def loaded(tenant: str, resource_tenant: str | None) -> Loaded:
        command = read(tenant=tenant)
        admitted = admission(command, tool, cancelled=(), now=NOW, keys=KEYS)
        assert isinstance(admitted, Admitted)
        resource = (
            PaymentFacts.resource(id="pay_A1001", tenant=resource_tenant, **PAYMENT_ATTRS)
            if resource_tenant is not None
            else None
        )
        return Loaded(command=command, tool=tool, admitted=admitted, resource=resource)

    refusals = resource_refusals(
        [
            loaded("tenant-a", "tenant-a"),
            loaded("tenant-a", None),  # missing row
            loaded("tenant-a", "tenant-b"),  # a foreign row the policy refuses
            loaded("tenant-b", "tenant-b"),
        ],
        policies,
    )
    assert refusals == [None, ErrorCode.NOT_FOUND, ErrorCode.PRECONDITION_FAILED, None]
    assert resource_refusals([], policies) == []


class _FakeDomain:
    """A read tool whose batch loader answers from a dict and counts its queries; its
    handler refuses one payment."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, list[str]]] = []
        self.rows = {("tenant-a", f"pay_A{n}"): PAYMENT_ATTRS for n in range(1000, 1010)} | {
            ("tenant-b", "pay_B2001"): PAYMENT_ATTRS
        }

    async def load_many(
        self, conn: Connection, tenant: str, reads: Sequence[tuple[Actor, Any]]
    ) -> list[Resource | None]:
        ids = [args.payment_id for _, args in reads]
        self.queries.append((tenant, ids))
        return [
            PaymentFacts.resource(id=i, tenant=tenant, **self.rows[(tenant, i)])
            if (tenant, i) in self.rows
            else None
            for i in ids
        ]

    async def load(self, conn: Connection, actor: Actor, args: Any, for_update: bool) -> None:
        raise AssertionError("a tool with load_many is never loaded one by one in a batch")

    async def handler(self, ctx: ExecutionContext) -> HandlerResult:
        assert ctx.resource is not None
        if ctx.resource.id == "pay_A1009":
            raise PreconditionFailed()
        return HandlerResult(result={"id": ctx.resource.id}, resource_id=ctx.resource.id)


async def test_one_reads_failure_is_its_own(policies: PolicySet) -> None:
    domain = _FakeDomain()
    catalog = Catalog(
        [
            Tool(
                name="get_payment",
                description="d",
                arguments=GetPaymentArguments,
                effect=Effect.READ,
                load=domain.load,
                load_many=domain.load_many,
                resource=PaymentFacts,
                handler=domain.handler,
            )
        ]
    )
    reader = BatchedReads(
        pool=cast(Any, None),
        catalog=catalog,
        policies=policies,
        receipt_keys=KEYS,
        cancelled=frozenset({"cancelled"}),
    )
    batch = [read(f"pay_A{1000 + n}", call_id=f"ok-{n}") for n in range(5)]
    batch += [
        read("pay_B2001", tenant="tenant-b", call_id="ok-b"),
        read("pay_A9999", call_id="missing"),
        read("pay_A1009", call_id="handler-refuses"),
        read("pay_A1001", call_id="cancelled"),
        read("pay_A1001", call_id="tampered", fp="0" * 64),
        read("pay_A1001", call_id="unknown-tool", tool="no_such_tool"),
    ]
    reads = [Read(command=c, trace_id=f"t-{c.call_id}") for c in batch]
    outcomes = await reader._run(cast(Connection, None), reads, policies)

    by_call = {o.call_id: o for o in outcomes}
    assert [o.call_id for o in outcomes] == [c.call_id for c in batch]
    for n in range(5):
        ok = by_call[f"ok-{n}"]
        assert ok.status is Status.SUCCEEDED
        assert ok.result == {"id": f"pay_A{1000 + n}"}
        assert ok.trace_id == f"t-ok-{n}"
    assert by_call["ok-b"].status is Status.SUCCEEDED and by_call["ok-b"].tenant == "tenant-b"

    def code(call_id: str) -> ErrorCode | None:
        error = by_call[call_id].error
        return error.code if error is not None else None

    assert code("missing") is ErrorCode.NOT_FOUND
    assert code("handler-refuses") is ErrorCode.PRECONDITION_FAILED
    assert by_call["cancelled"].status is Status.CANCELLED
    assert code("tampered") is ErrorCode.PRECONDITION_FAILED
    assert code("unknown-tool") is ErrorCode.UNKNOWN_TOOL
    # One query per tenant (and tool), for every admitted read of it.
    assert sorted(domain.queries) == [
        ("tenant-a", [*(f"pay_A{1000 + n}" for n in range(5)), "pay_A9999", "pay_A1009"]),
        ("tenant-b", ["pay_B2001"]),
    ]
