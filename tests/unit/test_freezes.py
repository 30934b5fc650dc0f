"""The kill switch, pure parts: the freeze record, the scope decision, the view, operator
rights, and the stages' refusals (authorizer, approval-join, executor's commit-time check)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from approvals.operators import OperatorRights, check_operator, check_resolver, visible_to
from commands.catalog import Catalog, Resource
from commands.freezes import NO_FREEZES, CallFacts, Freezes, Scope, ScopeKind, applied, frozen_scope
from commands.policy import PolicySet
from config.settings import Settings
from executors.decisions import STATUS_BY_CODE, command_freeze
from feeds.freezes import FleetFreezes
from schemas.envelopes import (
    CONTRACT_RECORDS,
    Actor,
    ActorRef,
    AuthorizedCall,
    CommittedCommand,
    Effect,
    FreezeRecord,
    Outcome,
    Route,
    Status,
)
from schemas.errors import SAFE_MESSAGES, ErrorCode, InvalidArguments, PolicyDenied
from schemas.names import COMPACTED_TOPICS, Topic
from schemas.vocabulary import AuditKind
from streams.approval import ApprovalState, Phase, Rules, Step, commits, frozen_instead
from streams.authorizer import on_validated_batch, one_by_one
from streams.commit import commit
from tests.unit.conftest import KEYS, NOW, PAYMENT_ATTRS, SIGNING
from tests.unit.test_stages import PAYMENT, FakeStore, validated


def freeze(scope: str, *, frozen: bool = True, reason: str = "incident 42") -> FreezeRecord:
    return FreezeRecord(scope=scope, frozen=frozen, by="ops-1", reason=reason, at=NOW)


def view(*scopes: str) -> Freezes:
    current = NO_FREEZES
    for scope in scopes:
        current = applied(current, freeze(scope))
    return current


REFUND = CallFacts(
    tenant="tenant-a",
    actor="agent-1",
    tool="propose_refund",
    effect=Effect.EXTERNAL_WRITE,
    owner="alice@example.com",
)
READ = CallFacts(tenant="tenant-a", actor="agent-1", tool="get_payment", effect=Effect.READ)


# -- the record ------------------------------------------------------------------------------


def test_freeze_record_is_the_controls_topics_compacted_contract() -> None:
    record = freeze("writes:tenant-a")
    assert CONTRACT_RECORDS["controls"] is FreezeRecord
    assert Topic.CONTROLS in COMPACTED_TOPICS
    assert FreezeRecord.model_validate_json(record.to_bytes()) == record
    with pytest.raises(ValidationError):
        FreezeRecord.model_validate({**record.model_dump(), "token": "secret"})
    with pytest.raises(ValidationError):  # frozen model: a record is never changed in place
        record.frozen = False  # type: ignore[misc]


@pytest.mark.parametrize(
    "scope",
    ["tenant:", "writes", "everything:*", "tenant:*", "tool:tenant-a", "agent:a b:x", "x:y:z"],
)
def test_a_scope_outside_the_six_kinds_is_refused(scope: str) -> None:
    with pytest.raises(ValidationError):
        freeze(scope)
    with pytest.raises(InvalidArguments):
        Scope.parse(scope)


def test_scopes_parse_into_kind_tenant_and_name() -> None:
    assert Scope.parse("agent:tenant-a:bot@x.com") == Scope(
        kind=ScopeKind.AGENT, tenant="tenant-a", name="bot@x.com"
    )
    assert Scope.parse("writes:*").every_tenant
    assert Scope.parse("tool:tenant-a:propose_refund").key == "tool:tenant-a:propose_refund"


def test_frozen_is_a_denied_outcome_with_a_safe_message() -> None:
    assert STATUS_BY_CODE[ErrorCode.FROZEN] is Status.DENIED
    assert "try again later" in SAFE_MESSAGES[ErrorCode.FROZEN]


# -- the decision -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "refund_frozen", "read_frozen"),
    [
        ("tenant:tenant-a", True, True),
        ("agent:tenant-a:agent-1", True, True),
        ("subject:tenant-a:alice@example.com", True, False),  # the read names no owner
        ("tool:tenant-a:propose_refund", True, False),
        ("writes:tenant-a", True, False),
        ("writes:*", True, False),
        ("tenant:tenant-b", False, False),
        ("writes:tenant-b", False, False),
        ("agent:tenant-b:agent-1", False, False),
        ("agent:tenant-a:agent-2", False, False),
        ("tool:tenant-a:get_payment", False, True),
    ],
)
def test_each_scope_kind_stops_what_it_names(
    scope: str, refund_frozen: bool, read_frozen: bool
) -> None:
    current = view(scope)
    assert (frozen_scope(current, REFUND) is not None) is refund_frozen
    assert (frozen_scope(current, READ) is not None) is read_frozen


def test_nothing_frozen_and_unfreezing_restore_service() -> None:
    assert frozen_scope(NO_FREEZES, REFUND) is None
    current = view("writes:tenant-a", "tool:tenant-a:propose_refund")
    assert frozen_scope(current, REFUND) is not None
    current = applied(current, freeze("writes:tenant-a", frozen=False))
    assert frozen_scope(current, REFUND) is not None  # still: its tool is frozen too
    current = applied(current, freeze("tool:tenant-a:propose_refund", frozen=False))
    assert frozen_scope(current, REFUND) is None
    assert len(current) == 0


def test_the_most_specific_freeze_is_named() -> None:
    found = frozen_scope(view("tenant:tenant-a", "agent:tenant-a:agent-1"), REFUND)
    assert found is not None and found.scope == "agent:tenant-a:agent-1"


def test_the_view_applies_topic_records_and_skips_unreadable_ones() -> None:
    fleet = FleetFreezes(Settings())
    fleet.apply(freeze("writes:tenant-a").to_bytes())
    fleet.apply(b"not json")
    fleet.apply(None)
    assert [r.scope for r in fleet.current.records()] == ["writes:tenant-a"]
    fleet.apply(freeze("writes:tenant-a", frozen=False).to_bytes())
    assert fleet.current.records() == []


# -- who may freeze ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rights() -> OperatorRights:
    return OperatorRights.from_directory()


@pytest.mark.parametrize(
    ("roles", "tenant", "scope", "allowed"),
    [
        (("operator",), "tenant-a", "writes:tenant-a", True),
        (("operator",), "tenant-a", "agent:tenant-a:agent-1", True),
        (("operator",), "tenant-a", "writes:tenant-b", False),
        (("operator",), "tenant-a", "writes:*", False),
        (("approver",), "tenant-a", "writes:tenant-a", False),
        (("fleet_operator",), "tenant-a", "writes:*", True),
        (("fleet_operator",), "tenant-a", "writes:tenant-b", False),
    ],
)
def test_operator_rights_are_cedar_policy(
    rights: OperatorRights, roles: tuple[str, ...], tenant: str, scope: str, allowed: bool
) -> None:
    operator = Actor(sub="ops-1", tenant=tenant, roles=roles)
    for frozen in (True, False):
        assert rights.allows(operator, frozen=frozen, scope=Scope.parse(scope)) is allowed
    if not allowed:
        with pytest.raises(PolicyDenied):
            check_operator(rights, operator, frozen=True, scope=Scope.parse(scope))


@pytest.mark.parametrize(
    ("roles", "tenant", "operation_tenant", "allowed"),
    [
        (("operator",), "tenant-a", "tenant-a", True),
        (("operator",), "tenant-a", "tenant-b", False),
        (("approver",), "tenant-a", "tenant-a", False),
        (("fleet_operator",), "tenant-a", "tenant-a", False),
    ],
)
def test_who_may_resolve_an_unknown_operation_is_cedar_policy(
    rights: OperatorRights,
    roles: tuple[str, ...],
    tenant: str,
    operation_tenant: str,
    allowed: bool,
) -> None:
    operator = Actor(sub="ops-1", tenant=tenant, roles=roles)
    assert rights.may_resolve(operator, operation_tenant) is allowed
    if not allowed:
        with pytest.raises(PolicyDenied):
            check_resolver(rights, operator, operation_tenant)
    # Resolving is its own action: the right to freeze the tenant's scopes is not it.
    assert rights.allows(operator, frozen=True, scope=Scope.parse(f"tenant:{tenant}")) is (
        "operator" in roles
    )


def test_an_operator_sees_their_tenants_and_fleet_wide_freezes() -> None:
    records = view("writes:tenant-a", "writes:tenant-b", "writes:*").records()
    operator = Actor(sub="ops-1", tenant="tenant-a", roles=("operator",))
    assert [r.scope for r in visible_to(operator, records)] == ["writes:*", "writes:tenant-a"]


# -- the stages ------------------------------------------------------------------------------


async def test_the_authorizer_refuses_new_calls_in_a_frozen_scope(
    catalog: Catalog, policies: PolicySet
) -> None:
    refund = validated(
        roles=("refund",),
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
    )
    read = validated(call_id="c-2", idempotency_key="k-2")
    fetch = one_by_one(FakeStore(PAYMENT).fetch)
    args: dict[str, Any] = {"catalog": catalog, "keys": KEYS, "policies": policies, "now": NOW}
    (refused,), (allowed,) = await on_validated_batch(
        [refund, read], fetch_many=fetch, freezes=view("writes:tenant-a"), **args
    )
    assert isinstance(refused.value, Outcome)
    assert refused.value.status is Status.DENIED
    assert refused.value.error is not None and refused.value.error.code is ErrorCode.FROZEN
    assert isinstance(allowed.value, CommittedCommand)  # a read is no write: committed
    (routed,), _ = await on_validated_batch([refund, read], fetch_many=fetch, **args)
    assert isinstance(routed.value, AuthorizedCall)  # nothing frozen: as before


def authorized_refund() -> AuthorizedCall:
    return AuthorizedCall(
        call_id="c-9",
        operation_id="tenant-a:k-9",
        idempotency_key="k-9",
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=("refund",)),
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
        fingerprint="f" * 64,
        effect=Effect.EXTERNAL_WRITE,
        policy_version="p1",
        route=Route.APPROVAL,
        proposed_at=NOW,
        authorized_at=NOW,
        resource_owner="alice@example.com",
    )


def test_an_approval_that_would_commit_a_frozen_call_ends_it_frozen() -> None:
    call = authorized_refund()
    state = ApprovalState(
        call_id=call.call_id, phase=Phase.PENDING, authorized=call, expires_at=NOW + timedelta(1)
    )
    approving = Step(state=state, emits=(commit(call, now=NOW),))
    assert commits(approving)
    assert not commits(Step(state=state))
    step = frozen_instead(
        state,
        approving,
        freeze("subject:tenant-a:alice@example.com"),
        now=NOW,
        rules=Rules(keys=SIGNING),
    )
    assert step.state is not None and step.state.phase is Phase.DENIED
    (ended,) = step.emits
    assert ended.topic is Topic.OUTCOMES
    assert isinstance(ended.value, Outcome)
    assert ended.value.status is Status.DENIED
    assert ended.value.error is not None and ended.value.error.code is ErrorCode.FROZEN
    (audit,) = step.audits
    assert audit.kind is AuditKind.APPROVAL_FROZEN
    assert audit.detail["scope"] == "subject:tenant-a:alice@example.com"
    assert audit.detail["frozen_by"] == "ops-1"


def test_the_commit_time_check_sees_the_command_and_its_fresh_resource() -> None:
    call = authorized_refund()
    command = CommittedCommand(
        **{
            k: v
            for k, v in call.model_dump().items()
            if k in CommittedCommand.model_fields and k != "v"
        },
        committed_at=NOW,
    )
    payment = Resource(kind="payment", id="pay_A1001", tenant="tenant-a", attributes=PAYMENT_ATTRS)
    assert command_freeze(view("writes:tenant-a"), command, None) is not None
    assert command_freeze(view("subject:tenant-a:alice@example.com"), command, None) is None
    assert command_freeze(view("subject:tenant-a:alice@example.com"), command, payment)
    assert command_freeze(view("writes:tenant-b", "tool:tenant-a:x"), command, payment) is None


def test_a_freeze_is_audited_with_who_why_and_the_scopes_tenant() -> None:
    from tests.unit.test_audit import _row

    record = FreezeRecord(
        scope="agent:tenant-a:agent-1",
        frozen=True,
        by="ops-1",
        by_tenant="tenant-a",
        reason="runaway agent",
        at=NOW,
    )
    row = _row(Topic.CONTROLS, json.loads(record.to_bytes()))
    assert row.stream == "controls"
    assert row.tenant == "tenant-a"
    stored = json.loads(row.record)
    assert (stored["scope"], stored["by"], stored["reason"]) == (
        "agent:tenant-a:agent-1",
        "ops-1",
        "runaway agent",
    )
    fleet_wide = _row(Topic.CONTROLS, json.loads(freeze("writes:*").to_bytes()))
    assert fleet_wide.tenant == "*"
