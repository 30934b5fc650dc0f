"""Who commits a call: the authorizer for a call that needs no approval, the approval-join
for every other permitted call and for an older authorizer's records (streams/commit.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from audit.story import record_event
from commands.catalog import Catalog
from commands.policy import PolicySet
from runtime.hop import status_of
from schemas.envelopes import (
    AuthorizedCall,
    CommittedCommand,
    Effect,
    Outcome,
    Route,
    Status,
)
from schemas.names import Topic
from streams.approval import ApprovalState, Phase, Rules, on_authorized
from streams.authorizer import on_validated
from streams.commit import (
    auto_receipt_needed,
    committed_at_authorization,
    committed_by_authorizer,
)
from streams.emit import Emit
from tests.unit.conftest import KEYS, NOW, SIGNING
from tests.unit.test_stages import PAYMENT, FakeStore, validated
from testsupport.records import authorized_refund

RULES = Rules(keys=SIGNING)
REFUND = {"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"}


async def authorize(catalog: Catalog, policies: PolicySet, **call: Any) -> tuple[Emit, ...]:
    return await on_validated(
        validated(**call),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=FakeStore(PAYMENT).fetch,
        now=NOW,
    )


def join(catalog: Catalog, call: AuthorizedCall, state: ApprovalState | None = None) -> Any:
    return on_authorized(state, call, tool=catalog.get(call.tool), now=NOW, rules=RULES)


def older_record(command: CommittedCommand, *, committed: bool) -> AuthorizedCall:
    """The `calls.authorized` record an authorizer of contract v1.4 to v1.7 (``committed``)
    or an older one published for the read it committed: what the join still reads during
    an upgrade."""
    shared = set(AuthorizedCall.model_fields) & set(CommittedCommand.model_fields)
    return AuthorizedCall(
        **command.model_dump(include=shared),
        idempotency_key=command.idempotency_key,
        route=Route.AUTO,
        proposed_at=NOW,
        authorized_at=command.committed_at,
        committed=committed,
    )


async def test_a_read_is_committed_by_the_authorizer_with_no_authorized_record(
    catalog: Catalog, policies: PolicySet
) -> None:
    """Contract v1.8: the command is the authorization's only record, permits included."""
    (committed,) = await authorize(catalog, policies)
    assert committed.topic is Topic.COMMITTED
    command = committed.value
    assert isinstance(command, CommittedCommand)
    assert committed.key == command.operation_id
    assert command.approval is None  # a read needs no receipt: none was ever signed
    assert command.policies  # which permits allowed it: kept for the audit
    # Exactly the record the approval-join builds for the same call from an older authorizer.
    (theirs,) = join(catalog, older_record(command, committed=False)).emits
    assert theirs == committed
    # The authorizer's hop is the one that committed it (metric status, trace).
    assert status_of((committed,)) == ("committed", None)


async def test_the_join_leaves_a_call_the_authorizer_committed_alone(
    catalog: Catalog, policies: PolicySet
) -> None:
    """A v1.4 to v1.7 authorizer's record of a read it committed (``committed: true``)."""
    (committed,) = await authorize(catalog, policies)
    assert isinstance(committed.value, CommittedCommand)
    record = older_record(committed.value, committed=True)
    assert committed_by_authorizer(record)
    step = join(catalog, record)
    assert (step.state, step.emits, step.audits, step.replay) == (None, (), (), ())
    held = ApprovalState(call_id="c-1", phase=Phase.HELD, held_until=NOW + timedelta(seconds=9))
    assert join(catalog, record, held).state is held  # nothing changes, no replay


async def test_an_older_authorizers_auto_record_is_committed_by_the_join_once(
    catalog: Catalog, policies: PolicySet
) -> None:
    """Upgrade: a record without `committed` (the authorizer did not commit it)."""
    (committed,) = await authorize(catalog, policies)
    assert isinstance(committed.value, CommittedCommand)
    older = older_record(committed.value, committed=False)
    assert not committed_by_authorizer(older)
    (emit,) = join(catalog, older).emits
    assert emit == committed


async def test_calls_that_need_an_approval_or_a_receipt_stay_with_the_join(
    catalog: Catalog, policies: PolicySet
) -> None:
    (needs_human,) = await authorize(
        catalog, policies, roles=("refund",), tool="propose_refund", arguments=REFUND
    )
    assert isinstance(needs_human.value, AuthorizedCall)
    assert needs_human.value.route is Route.APPROVAL and not needs_human.value.committed
    (auto_approved,) = await authorize(
        catalog, policies, roles=("refund_auto",), tool="propose_refund", arguments=REFUND
    )
    call = auto_approved.value
    assert isinstance(call, AuthorizedCall) and call.route is Route.AUTO
    assert auto_receipt_needed(call) and not call.committed
    step = join(catalog, call)
    (command,) = [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]
    assert command.approval is not None and command.approval.basis == "auto"
    assert [a.kind for a in step.audits] == ["approval_auto"]


async def test_a_denied_call_is_not_committed(catalog: Catalog, policies: PolicySet) -> None:
    (denied,) = await authorize(catalog, policies, tenant="tenant-b")
    assert isinstance(denied.value, Outcome) and denied.value.status is Status.DENIED


def test_a_committed_flag_on_a_call_the_authorizer_never_commits_is_not_honoured(
    catalog: Catalog,
) -> None:
    """A record claiming `committed` for a call that needs an approval still gets its request
    (and an auto-approved one its receipt): nothing is committed without the join's checks."""
    asking = authorized_refund("c-7", REFUND, now=NOW, committed=True)
    assert asking.route is Route.APPROVAL and not committed_by_authorizer(asking)
    step = join(catalog, asking)
    assert step.state is not None and step.state.phase is Phase.PENDING
    auto = authorized_refund(
        "c-8", REFUND, now=NOW, route=Route.AUTO, auto_approved_by="p", committed=True
    )
    (command,) = [e.value for e in join(catalog, auto).emits]
    assert isinstance(command, CommittedCommand) and command.approval is not None


@pytest.mark.parametrize(
    ("route", "effect", "auto_policy", "by_authorizer"),
    [
        (Route.AUTO, Effect.READ, None, True),
        (Route.AUTO, Effect.EXTERNAL_WRITE, None, True),  # the join commits it unreceipted too
        (Route.AUTO, Effect.EXTERNAL_WRITE, "p", False),
        (Route.AUTO, Effect.REVERSIBLE_WRITE, "p", False),
        (Route.APPROVAL, Effect.READ, None, False),
        (Route.APPROVAL, Effect.EXTERNAL_WRITE, None, False),
    ],
)
def test_who_commits(
    route: Route, effect: Effect, auto_policy: str | None, by_authorizer: bool
) -> None:
    call = authorized_refund(
        "c-9", REFUND, now=NOW, route=route, effect=effect, auto_approved_by=auto_policy
    )
    assert committed_at_authorization(call) is by_authorizer


async def test_the_audit_story_of_a_read_keeps_its_authorization_in_its_commit(
    catalog: Catalog, policies: PolicySet
) -> None:
    """v1.8: a read's one record of its authorization is its command, permits included."""
    (committed,) = await authorize(catalog, policies)
    event = record_event(
        {
            "stream": "commands.committed",
            "kafka_partition": 0,
            "kafka_offset": 1,
            "record_at": NOW,
            "record": committed.value.model_dump(mode="json"),
        }
    )
    assert (event.stage, event.what) == ("authorizer", "command committed for execution")
    facts = dict(event.facts)
    assert facts["approval"] == "none needed (auto route)"
    assert isinstance(committed.value, CommittedCommand)
    assert facts["policies"] == ", ".join(committed.value.policies)
