"""`@approval("auto")` calls are committed by the authorizer with the policy's signed receipt
(issue 44: one hop fewer than through the join, docs/measurements.md), the same command and
audit row the approval-join builds for an older authorizer's record; the executor's check
accepts the receipt for this call only. Pure, no brokers."""

from __future__ import annotations

from typing import Any

from approvals.signing import receipt_refusal
from commands.catalog import Catalog
from commands.policy import PolicySet
from schemas.envelopes import AuthorizedCall, CommittedCommand, Route
from streams.approval import Rules, auto_audits, auto_commit, on_authorized
from streams.authorizer import on_validated_batch, one_by_one
from streams.emit import Emit
from tests.unit.conftest import KEYS, NOW, SIGNING
from tests.unit.test_stages import PAYMENT, FakeStore, validated

RULES = Rules(keys=SIGNING)
REFUND = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"}


async def authorize(
    catalog: Catalog, policies: PolicySet, *, receipts: Rules | None, **call: Any
) -> tuple[Emit, ...]:
    (emits,) = await on_validated_batch(
        [validated(**call)],
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch_many=one_by_one(FakeStore(PAYMENT).fetch),
        now=NOW,
        receipts=receipts,
    )
    return emits


async def test_the_authorizer_commits_an_auto_approved_write_with_a_bound_receipt(
    catalog: Catalog, policies: PolicySet
) -> None:
    auto = {"roles": ("refund_auto",), "tool": "propose_refund", "arguments": REFUND}
    (routed,) = await authorize(catalog, policies, receipts=None, **auto)
    call = routed.value
    assert isinstance(call, AuthorizedCall) and call.route is Route.AUTO  # to the join
    (committed,) = await authorize(catalog, policies, receipts=RULES, **auto)
    command = committed.value
    assert isinstance(command, CommittedCommand) and command.call_id == call.call_id
    receipt = command.approval
    assert receipt is not None
    assert (receipt.basis, receipt.auto_policy) == ("auto", call.auto_approved_by)
    assert receipt.approvers == (f"policy:{call.auto_approved_by}",)

    def refusal(call_id: str = call.call_id, fingerprint: str = call.fingerprint) -> object:
        return receipt_refusal(
            receipt,
            call_id=call_id,
            tenant=call.tenant,
            fingerprint=fingerprint,
            policy_version=call.policy_version,
            keys=SIGNING,
            now=NOW,
        )

    assert refusal() is None
    assert refusal(call_id="another-call") is not None
    assert refusal(fingerprint="sha256:other") is not None
    # What the join would have committed for the same record (an older authorizer's).
    joined = on_authorized(None, call, tool=catalog.get(call.tool), now=NOW, rules=RULES)
    assert joined.emits == auto_commit(call, now=NOW, rules=RULES).emits
    assert auto_audits((committed,)) == joined.audits
    assert [a.kind for a in auto_audits((committed,))] == ["approval_auto"]


async def test_a_call_that_needs_a_human_still_goes_to_the_join(
    catalog: Catalog, policies: PolicySet
) -> None:
    (routed,) = await authorize(
        catalog,
        policies,
        receipts=RULES,
        roles=("refund",),
        tool="propose_refund",
        arguments=REFUND,
    )
    assert isinstance(routed.value, AuthorizedCall) and routed.value.route is Route.APPROVAL
    assert auto_audits((routed,)) == ()


async def test_a_batch_of_many_calls_gives_way_to_other_tasks_as_it_goes(
    catalog: Catalog, policies: PolicySet
) -> None:
    """A backlog's batch (hundreds of calls) does not hold the process's event loop from its
    first step to its last: other lanes' batches in the same process (the validator's, of
    another tenant) run every ``YIELD_EVERY`` calls of each step."""
    import asyncio

    from runtime.turns import batch_of
    from streams.authorizer import YIELD_EVERY

    calls = [validated(call_id=f"c-{i}", idempotency_key=f"k-{i}") for i in range(200)]
    done = asyncio.Event()
    turns = 0

    async def other_lane() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(other_lane())
    await asyncio.sleep(0)
    before = turns
    with batch_of(len(calls)):
        decided = await on_validated_batch(
            calls,
            catalog=catalog,
            keys=KEYS,
            policies=policies,
            fetch_many=one_by_one(FakeStore(PAYMENT).fetch),
            now=NOW,
        )
    done.set()
    await ticking
    assert len(decided) == len(calls)
    # Three steps (check, prepare, route), each giving way every YIELD_EVERY calls.
    assert turns - before >= 3 * len(calls) // YIELD_EVERY
