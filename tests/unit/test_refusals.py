"""Every refusal names its reason, safely: policy ids, forbid vs no permit, a policy's
message, evaluation errors (logged, counted, audited, fail closed), provider renderings."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from audit.masking import Masker
from audit.records import KafkaRecord, audit_row
from commands.catalog import Catalog, HandlerResult, Resource, Tool, ToolArguments
from commands.policy import AuthorizationRequest, PolicySet, Verdict, authorize, authorize_batch
from schemas.envelopes import Actor, Effect, ErrorInfo, Outcome, Stage, Status
from schemas.errors import SAFE_MESSAGES, ErrorCode, PermanentFailure, RefusalReason
from schemas.providers import (
    result_text,
    to_anthropic_tool_result,
    to_mcp_call_tool_result,
    to_openai_tool_message,
)
from tests.unit.conftest import NOW

ACTOR = Actor(sub="alice", tenant="tenant-a", roles=("support",))


class OrderArguments(ToolArguments):
    order_id: str


async def _handler(_ctx: Any) -> HandlerResult:
    return HandlerResult(result={})


async def _load(*_args: Any) -> Resource | None:
    return None


def _tool(name: str, effect: Effect = Effect.READ) -> Tool:
    return Tool(
        name=name,
        description=name,
        arguments=OrderArguments,
        effect=effect,
        handler=_handler,
        load=_load,
    )


SHOP = Catalog([_tool("get_order"), _tool("cancel_order", Effect.DESTRUCTIVE), _tool("get_user")])

SCHEMA = {
    "": {
        "entityTypes": {
            "User": {
                "shape": {
                    "type": "Record",
                    "attributes": {
                        "tenant": {"type": "String"},
                        "sub": {"type": "String"},
                        "roles": {"type": "Set", "element": {"type": "String"}},
                    },
                }
            },
            "Order": {
                "shape": {
                    "type": "Record",
                    "attributes": {
                        "tenant": {"type": "String"},
                        "status": {"type": "String"},
                        "total_minor": {"type": "Long"},
                    },
                }
            },
        },
        "actions": {
            name: {
                "appliesTo": {
                    "principalTypes": ["User"],
                    "resourceTypes": [kind],
                    "context": {
                        "type": "Record",
                        "attributes": {
                            "effect": {"type": "String"},
                            "arguments": {
                                "type": "Record",
                                "attributes": {"order_id": {"type": "String"}},
                            },
                        },
                    },
                }
            }
            for name, kind in (
                ("get_order", "Order"),
                ("cancel_order", "Order"),
                ("get_user", "User"),
            )
        },
    }
}

POLICIES = """
@id("order-read-own-tenant")
permit (principal, action == Action::"get_order", resource)
when { resource.tenant == principal.tenant && resource.total_minor >= 0 };

@id("user-read-self")
permit (principal, action == Action::"get_user", resource)
when { resource.tenant == principal.tenant };

@id("pending-only-cancel")
@message("Only pending orders can be cancelled.")
forbid (principal, action == Action::"cancel_order", resource)
when { resource.status != "pending" };

@id("cancel-own-tenant")
permit (principal, action == Action::"cancel_order", resource)
when { resource.tenant == principal.tenant };
"""


@pytest.fixture(scope="module")
def shop_policies() -> PolicySet:
    return PolicySet.from_sources(POLICIES, json.dumps(SCHEMA))


def order(**attributes: Any) -> Resource:
    base = {"status": "pending", "total_minor": 1200}
    return Resource(kind="order", id="o-1", tenant="tenant-a", attributes={**base, **attributes})


def decide(policies: PolicySet, tool: str, resource: Resource, actor: Actor = ACTOR) -> Any:
    found = SHOP.get(tool)
    assert found is not None
    return authorize(
        actor=actor,
        tool=found,
        resource=resource,
        arguments={"order_id": resource.id},
        policies=policies,
    )


def denial_outcome(decision: Any, tool: str = "get_order") -> Outcome:
    return Outcome(
        call_id="c-1",
        tool=tool,
        tenant="tenant-a",
        status=Status.DENIED,
        stage=Stage.AUTHORIZE,
        error=decision.error_info(),
        policy_version=decision.policy_version,
        at=NOW,
    )


def renderings(outcome: Outcome) -> list[str]:
    """The model-facing text of each provider's rendering, plus MCP's structured content."""
    return [
        to_openai_tool_message(outcome, tool_call_id="t1")["content"],
        to_anthropic_tool_result(outcome, tool_use_id="t1")["content"][0]["text"],
        to_mcp_call_tool_result(outcome)["content"][0]["text"],
        json.dumps(to_mcp_call_tool_result(outcome)["structuredContent"]),
    ]


def counted(policy: str) -> float:
    value = REGISTRY.get_sample_value("ratifier_policy_evaluation_errors_total", {"policy": policy})
    return value or 0.0


def test_permit_names_the_permitting_policy_by_its_id(shop_policies: PolicySet) -> None:
    decision = decide(shop_policies, "get_order", order())
    assert decision.verdict is Verdict.PERMIT
    assert decision.policy_ids == ("order-read-own-tenant",)
    assert decision.error_info() is None


def test_a_forbid_with_a_message_reaches_the_outcome_and_every_rendering(
    shop_policies: PolicySet,
) -> None:
    decision = decide(shop_policies, "cancel_order", order(status="shipped"))
    assert decision.code is ErrorCode.POLICY_DENIED
    assert decision.refusal is RefusalReason.FORBID
    assert decision.policy_ids == ("pending-only-cancel",)
    outcome = denial_outcome(decision, "cancel_order")
    assert outcome.error is not None
    assert outcome.error.message == "Only pending orders can be cancelled."
    assert outcome.error.reason is RefusalReason.FORBID
    assert outcome.error.policies == ("pending-only-cancel",)
    for text in renderings(outcome):
        assert "Only pending orders can be cancelled." in text
        assert "policy_denied" in text
        assert "forbid" in text
    body = json.loads(result_text(outcome))
    assert body == {
        "status": "denied",
        "code": "policy_denied",
        "message": "Only pending orders can be cancelled.",
        "reason": "forbid",
    }


SEVERAL_FORBIDS = [
    """@id("a-not-now")
@message("Orders cannot be changed right now.")
forbid (principal, action, resource)
when { resource has status && resource.status != "pending" };""",
    """@id("b-pending-only")
@message("Only pending orders can be cancelled.")
forbid (principal, action == Action::"cancel_order", resource)
when { resource.status != "pending" };""",
    """@id("c-big-shipped")
@message("Large shipped orders are cancelled by the warehouse.")
forbid (principal, action == Action::"cancel_order", resource)
when { resource.status != "pending" && resource.total_minor > 1000 };""",
    """@id("d-shipped")
@priority("10")
@message("The order has shipped; ask for a return instead.")
forbid (principal, action, resource)
when { resource has status && resource.status == "shipped" };""",
    """@id("e-silent")
@priority("99")
forbid (principal, action == Action::"cancel_order", resource)
when { resource.status == "shipped" };""",
    """@id("cancel-own-tenant")
permit (principal, action == Action::"cancel_order", resource)
when { resource.tenant == principal.tenant };""",
]


@pytest.mark.parametrize("order_of_policies", [1, -1], ids=["as-written", "reversed"])
@pytest.mark.parametrize(
    ("attributes", "message", "first"),
    [
        # Highest @priority among the forbids with a @message wins, whatever their @id.
        ({"status": "shipped"}, "The order has shipped; ask for a return instead.", "d-shipped"),
        # Same priority: a scoped forbid beats a wildcard; more conditions beat fewer.
        (
            {"status": "returned", "total_minor": 1200},
            "Large shipped orders are cancelled by the warehouse.",
            "c-big-shipped",
        ),
        (
            {"status": "returned", "total_minor": 500},
            "Only pending orders can be cancelled.",
            "b-pending-only",
        ),
    ],
    ids=["priority", "more-conditions", "scoped-beats-wildcard"],
)
def test_several_matching_forbids_show_the_message_of_the_strongest_one(
    order_of_policies: int, attributes: dict[str, Any], message: str, first: str
) -> None:
    text = "\n\n".join(SEVERAL_FORBIDS[::order_of_policies])
    policies = PolicySet.from_sources(text, json.dumps(SCHEMA))
    decision = decide(policies, "cancel_order", order(**attributes))
    assert decision.refusal is RefusalReason.FORBID
    error = decision.error_info()
    assert error is not None and error.message == message
    # error.policies lists the forbids from the one whose message is shown.
    assert error.policies[0] == first
    assert json.loads(result_text(denial_outcome(decision, "cancel_order")))["message"] == message


def test_equal_forbids_fall_back_to_the_first_id() -> None:
    twins = [
        """@id("z-twin") @message("Z.") forbid (principal, action, resource);""",
        """@id("m-twin") @message("M.") forbid (principal, action, resource);""",
        """@id("all") permit (principal, action, resource);""",
    ]
    for text in (twins, twins[::-1]):
        policies = PolicySet.from_sources("\n".join(text), json.dumps(SCHEMA))
        decision = decide(policies, "cancel_order", order())
        assert decision.message == "M."
        assert decision.policy_ids == ("m-twin", "z-twin")


def test_a_priority_that_is_not_an_integer_is_refused() -> None:
    from schemas.errors import ConfigurationError

    bad = '@id("x") @priority("high") @message("X.") forbid (principal, action, resource);'
    with pytest.raises(ConfigurationError, match="priority"):
        PolicySet.from_sources(bad, json.dumps(SCHEMA))


def test_no_permit_is_told_apart_from_a_forbid(shop_policies: PolicySet) -> None:
    foreign_actor = Actor(sub="bob", tenant="tenant-a", roles=())
    decision = decide(shop_policies, "get_order", order(total_minor=-1), actor=foreign_actor)
    assert decision.refusal is RefusalReason.NO_PERMIT
    assert decision.policy_ids == ()
    error = decision.error_info()
    assert error.message == SAFE_MESSAGES[ErrorCode.POLICY_DENIED]
    assert error.reason is RefusalReason.NO_PERMIT


# Each Cedar error kind the issue names, with the policy it must be charged to.
ERROR_KINDS = {
    "undeclared attribute": ("get_order", order(secret_note="tenant-b owes 5000")),
    "missing attribute": (
        "get_order",
        Resource(kind="order", id="o-1", tenant="tenant-a", attributes={"status": "pending"}),
    ),
    "float attribute": ("get_order", order(total_minor=12.5)),
    "kind `user` collides with the principal": (
        "get_user",
        Resource(kind="user", id="u-9", tenant="tenant-a", attributes={"name": "Carol"}),
    ),
}
CHARGED = {"get_order": "order-read-own-tenant", "get_user": "user-read-self"}


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
def test_each_cedar_error_kind_is_a_logged_counted_audited_denial_naming_the_policy(
    kind: str, shop_policies: PolicySet, caplog: pytest.LogCaptureFixture
) -> None:
    tool, resource = ERROR_KINDS[kind]
    policy = CHARGED[tool]
    before = counted(policy)
    with caplog.at_level(logging.ERROR, logger="ratifier.policies"):
        decision = decide(shop_policies, tool, resource)
    # Fail closed, with a distinct detail.
    assert decision.verdict is Verdict.DENY
    assert decision.code is ErrorCode.POLICY_DENIED
    assert decision.refusal is RefusalReason.EVALUATION_ERROR
    assert policy in decision.policy_ids
    assert decision.errors
    # Logged, with the policy and Cedar's words.
    logged = [r.getMessage() for r in caplog.records if "evaluation error" in r.getMessage()]
    assert logged
    assert policy in logged[0]
    # Counted per policy.
    assert counted(policy) == before + 1
    # Audited: the outcome record names the reason and the policy in the audit row.
    outcome = denial_outcome(decision, tool)
    row = audit_row(
        KafkaRecord(
            topic="ratifier.outcomes",
            partition=0,
            offset=1,
            timestamp_ms=0,
            key=b"c-1",
            value=outcome.to_bytes(),
        ),
        prefix="ratifier.",
        masker=Masker(secret_names=frozenset(), salt="s"),
        max_bytes=1 << 16,
    )
    audited = json.loads(row.record)
    assert audited["error"]["reason"] == "evaluation_error"
    assert policy in audited["error"]["policies"]
    assert row.error_code == "policy_denied"
    # Cedar's diagnostics quote entities: they never reach the model.
    for text in renderings(outcome):
        assert "evaluation_error" in text
        assert "tenant-b" not in text
        assert "Carol" not in text
        assert "Cedar" not in text
        assert all(e not in text for e in decision.errors)


def test_one_bad_resource_does_not_decide_the_rest_of_its_batch(
    shop_policies: PolicySet,
) -> None:
    tool = SHOP.get("get_order")
    assert tool is not None
    good = order()
    bad = Resource(
        kind="order", id="o-2", tenant="tenant-a", attributes={**good.attributes, "x": 1}
    )
    decisions = authorize_batch(
        [
            AuthorizationRequest(actor=ACTOR, tool=tool, resource=r, arguments={"order_id": r.id})
            for r in (good, bad, good)
        ],
        shop_policies,
    )
    assert [d.verdict for d in decisions] == [Verdict.PERMIT, Verdict.DENY, Verdict.PERMIT]
    assert decisions[1].refusal is RefusalReason.EVALUATION_ERROR
    # The batch's entity list (other calls' data) is not in the kept diagnostics.
    assert all("o-1" not in e for e in decisions[1].errors)


def test_a_handler_message_reaches_the_model_only_when_marked_safe() -> None:
    secret = "DE89370400440532013000"
    unsafe = PermanentFailure(f"provider refused account {secret} of tenant-b")
    safe = PermanentFailure(
        f"provider refused account {secret}", for_model="The bank account was refused."
    )
    unsafe_error = ErrorInfo.of(unsafe.code, unsafe.model_message, reason=RefusalReason.HANDLER)
    safe_error = ErrorInfo.of(safe.code, safe.model_message, reason=RefusalReason.HANDLER)
    assert unsafe_error.message == SAFE_MESSAGES[ErrorCode.PERMANENT_ERROR]
    assert safe_error.message == "The bank account was refused."
    for error in (unsafe_error, safe_error):
        outcome = Outcome(
            call_id="c-1",
            tool="add_payout_account",
            tenant="tenant-a",
            status=Status.FAILED,
            stage=Stage.EXECUTE,
            error=error,
            at=NOW,
        )
        for text in renderings(outcome):
            assert secret not in text
            assert "tenant-b" not in text
            assert error.message in text


def test_the_approvers_reason_reaches_the_outcome() -> None:
    error = ErrorInfo.approver_rejected("Customer already got a voucher.\n")
    assert error.code is ErrorCode.APPROVAL_REJECTED
    assert error.reason is RefusalReason.APPROVER
    assert error.message.endswith("Reason: Customer already got a voucher.")
    assert ErrorInfo.approver_rejected(None).message == SAFE_MESSAGES[ErrorCode.APPROVAL_REJECTED]
    assert len(ErrorInfo.approver_rejected("x" * 5000).message) <= 300


def test_reference_forbid_reports_its_id(policies: PolicySet) -> None:
    from commands.reference import catalog

    tool = catalog.get("delete_payment_method")
    assert tool is not None
    decision = authorize(
        actor=Actor(sub="u", tenant="tenant-a", roles=("admin",)),
        tool=tool,
        resource=Resource(
            kind="payment_method",
            id="pm_A1",
            tenant="tenant-a",
            attributes={"brand": "visa", "last4": "4242"},
        ),
        arguments={"payment_method_id": "pm_A1"},
        policies=policies,
    )
    assert decision.refusal is RefusalReason.FORBID
    assert decision.policy_ids == ("destructive-denied",)


async def test_the_authorizer_puts_reason_policies_and_message_on_the_outcome(
    catalog: Catalog, policies: PolicySet
) -> None:
    from schemas.envelopes import ValidatedCall
    from streams.authorizer import on_validated
    from tests.unit.conftest import KEYS, token

    method = Resource(
        kind="payment_method",
        id="pm_A1",
        tenant="tenant-a",
        attributes={"brand": "visa", "last4": "4242"},
    )

    async def fetch(_tool: Tool, _who: Any, _args: ToolArguments) -> Resource | None:
        return method

    call = ValidatedCall(
        call_id="c-1",
        idempotency_key="k-1",
        tool="delete_payment_method",
        arguments={"payment_method_id": "pm_A1"},
        context=token(roles=("admin",)),
        proposed_at=NOW,
        validated_at=NOW,
    )
    (emit,) = await on_validated(
        call, catalog=catalog, keys=KEYS, policies=policies, fetch=fetch, now=NOW
    )
    assert isinstance(emit.value, Outcome)
    assert emit.value.error is not None
    assert emit.value.error.reason is RefusalReason.FORBID
    assert emit.value.error.policies == ("destructive-denied",)
    assert emit.value.error.message == "Destructive actions are not allowed."


def test_the_audit_story_tells_forbid_no_permit_and_evaluation_errors_apart() -> None:
    from datetime import timedelta

    from audit.story import record_event

    def event(error: dict[str, Any]) -> dict[str, str]:
        row = {
            "stream": "outcomes",
            "kafka_partition": 0,
            "kafka_offset": 1,
            "record_at": NOW + timedelta(seconds=1),
            "record": {"status": "denied", "stage": "authorize", "error": error},
        }
        return dict(record_event(row).facts)

    forbid = event(
        {"code": "policy_denied", "reason": "forbid", "policies": ["destructive-denied"]}
    )
    assert "forbid policy matched" in forbid["meaning"]
    assert forbid["policies"] == "destructive-denied"
    broken = event({"code": "policy_denied", "reason": "evaluation_error", "policies": ["p"]})
    assert "could not be evaluated" in broken["meaning"]
    assert "no Cedar policy permits" in event({"code": "policy_denied"})["meaning"]


def test_a_loader_returning_undeclared_or_missing_facts_is_named_with_its_tool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from commands.catalog import ResourceFacts
    from commands.cedar_schema import generate_schema

    class OrderFacts(ResourceFacts):
        kind = "order"
        status: str
        total_minor: int

    tool = Tool(
        name="get_order",
        description="d",
        arguments=OrderArguments,
        effect=Effect.READ,
        handler=_handler,
        load=_load,
        resource=OrderFacts,
    )
    policies = PolicySet.from_sources(
        '@id("order-read") permit (principal, action, resource);',
        generate_schema(Catalog([tool])).text(),
    )
    loaded = Resource(
        kind="order",
        id="o-1",
        tenant="tenant-a",
        attributes={"status": "open", "note": "x"},
    )
    with caplog.at_level(logging.ERROR, logger="ratifier.policies"):
        decision = authorize(
            actor=ACTOR,
            tool=tool,
            resource=loaded,
            arguments={"order_id": "o-1"},
            policies=policies,
        )
    assert decision.refusal is RefusalReason.EVALUATION_ERROR
    assert decision.policy_ids == ("order-read",)
    assert any("tool get_order: the loader returned attribute 'note'" in e for e in decision.errors)
    assert any("did not return attribute 'total_minor'" in e for e in decision.errors)
    assert "tool get_order: the loader returned attribute 'note'" in caplog.text


async def test_an_authorized_call_names_the_permits_that_allowed_it(
    catalog: Catalog, policies: PolicySet
) -> None:
    """On its command when the authorizer commits it (contract v1.8: no `calls.authorized`
    record then)."""
    from schemas.envelopes import CommittedCommand, ValidatedCall
    from streams.authorizer import on_validated
    from tests.unit.conftest import KEYS, PAYMENT_ATTRS, token

    payment = Resource(kind="payment", id="pay_A1001", tenant="tenant-a", attributes=PAYMENT_ATTRS)

    async def fetch(_tool: Tool, _who: Any, _args: ToolArguments) -> Resource | None:
        return payment

    call = ValidatedCall(
        call_id="c-2",
        idempotency_key="k-2",
        tool="get_payment",
        arguments={"payment_id": "pay_A1001"},
        context=token(),
        proposed_at=NOW,
        validated_at=NOW,
    )
    (emit,) = await on_validated(
        call, catalog=catalog, keys=KEYS, policies=policies, fetch=fetch, now=NOW
    )
    assert isinstance(emit.value, CommittedCommand)
    assert emit.value.policies == ("read-own-tenant",)
