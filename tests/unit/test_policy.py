from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import cedarpy
import pytest

from commands.catalog import Catalog, Resource
from commands.policy import (
    DEFAULT_POLICY_DIR,
    AuthorizationRequest,
    PolicySet,
    Verdict,
    authorize,
    authorize_batch,
)
from schemas.envelopes import Actor, Route
from schemas.errors import ConfigurationError, ErrorCode
from tests.unit.conftest import PAYMENT_ATTRS

PAYMENT_A = Resource(kind="payment", id="pay_A1001", tenant="tenant-a", attributes=PAYMENT_ATTRS)
SCHEMA = (DEFAULT_POLICY_DIR / "schema.cedarschema.json").read_text()


def decide(
    catalog: Catalog,
    policies: PolicySet,
    tool: str,
    args: dict[str, Any],
    roles: tuple[str, ...] = ("support",),
    resource: Resource | None = PAYMENT_A,
    tenant: str = "tenant-a",
) -> Any:
    found = catalog.get(tool)
    assert found is not None
    return authorize(
        actor=Actor(sub="u", tenant=tenant, roles=roles),
        tool=found,
        resource=resource,
        arguments=args,
        policies=policies,
    )


def one_by_one(requests: list[AuthorizationRequest], policies: PolicySet) -> list[Any]:
    """Each request decided alone (a batch of one, as `authorize` does)."""
    return [authorize_batch([r], policies)[0] for r in requests]


def test_read_own_tenant_is_auto(catalog: Catalog, policies: PolicySet) -> None:
    decision = decide(catalog, policies, "get_payment", {"payment_id": "pay_A1001"})
    assert decision.verdict is Verdict.PERMIT
    assert decision.route is Route.AUTO
    assert decision.policy_version == policies.version


def test_foreign_resource_is_not_found(catalog: Catalog, policies: PolicySet) -> None:
    decision = decide(
        catalog, policies, "get_payment", {"payment_id": "pay_A1001"}, tenant="tenant-b"
    )
    assert decision.code is ErrorCode.NOT_FOUND


def test_refund_needs_role_and_amount_and_goes_to_approval(
    catalog: Catalog, policies: PolicySet
) -> None:
    args = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "r"}
    assert decide(catalog, policies, "propose_refund", args).code is ErrorCode.POLICY_DENIED
    ok = decide(catalog, policies, "propose_refund", args, roles=("refund",))
    assert (ok.verdict, ok.route) == (Verdict.PERMIT, Route.APPROVAL)
    over = decide(
        catalog, policies, "propose_refund", {**args, "amount_minor": 4901}, roles=("refund",)
    )
    assert over.code is ErrorCode.POLICY_DENIED


def test_destructive_is_denied_even_for_admins(catalog: Catalog, policies: PolicySet) -> None:
    method = Resource(
        kind="payment_method",
        id="pm_A1",
        tenant="tenant-a",
        attributes={"brand": "visa", "last4": "4242"},
    )
    decision = decide(
        catalog,
        policies,
        "delete_payment_method",
        {"payment_method_id": "pm_A1"},
        roles=("admin", "refund", "approver"),
        resource=method,
    )
    assert decision.code is ErrorCode.POLICY_DENIED


def test_version_is_content_hash(tmp_path: Path) -> None:
    (tmp_path / "s.cedarschema.json").write_text(SCHEMA)
    (tmp_path / "a.cedar").write_text("permit (principal, action, resource);")
    first = PolicySet.from_directory(tmp_path)
    assert first.version == PolicySet.from_directory(tmp_path).version
    (tmp_path / "a.cedar").write_text("forbid (principal, action, resource);")
    assert PolicySet.from_directory(tmp_path).version != first.version


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("permit (principal, action resource", "does not parse"),
        (
            "permit (principal, action, resource) when { resource.nope == 1 };",
            "do not match the Cedar schema",
        ),
    ],
)
def test_broken_policy_stops_start_up(tmp_path: Path, policy: str, message: str) -> None:
    (tmp_path / "s.cedarschema.json").write_text(SCHEMA)
    (tmp_path / "bad.cedar").write_text(policy)
    with pytest.raises(ConfigurationError, match=message):
        PolicySet.from_directory(tmp_path)


def test_missing_schema_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "a.cedar").write_text("permit (principal, action, resource);")
    with pytest.raises(ConfigurationError, match="cedarschema"):
        PolicySet.from_directory(tmp_path)


def test_approval_annotations_route(catalog: Catalog) -> None:
    policies = PolicySet.from_sources(
        """
        @approval("auto")
        permit (principal, action == Action::"propose_refund", resource)
        when { context.arguments.amount_minor <= 500 };
        @approval("required")
        permit (principal, action == Action::"get_payment", resource);
        """,
        SCHEMA,
    )
    small = decide(
        catalog,
        policies,
        "propose_refund",
        {"payment_id": "pay_A1001", "amount_minor": 500, "reason": "r"},
    )
    big = decide(
        catalog,
        policies,
        "propose_refund",
        {"payment_id": "pay_A1001", "amount_minor": 501, "reason": "r"},
    )
    read = decide(catalog, policies, "get_payment", {"payment_id": "pay_A1001"})
    assert (small.route, big.verdict, read.route) == (Route.AUTO, Verdict.DENY, Route.APPROVAL)


def test_batch_equals_single_even_with_conflicting_entities(
    catalog: Catalog, policies: PolicySet
) -> None:
    refund = catalog.get("propose_refund")
    assert refund is not None
    args = {"payment_id": "pay_A1001", "amount_minor": 4000, "reason": "r"}
    drained = Resource(
        kind="payment",
        id="pay_A1001",
        tenant="tenant-a",
        attributes={**PAYMENT_ATTRS, "refundable_minor": 100},
    )
    requests = [
        AuthorizationRequest(
            actor=Actor(sub="u", tenant="tenant-a", roles=roles),
            tool=refund,
            resource=resource,
            arguments=args,
        )
        for roles, resource in [
            (("refund",), PAYMENT_A),
            (("support",), PAYMENT_A),
            (("refund",), drained),
            (("refund",), PAYMENT_A),
        ]
    ]
    batched = [d.verdict for d in authorize_batch(requests, policies)]
    single = [d.verdict for d in one_by_one(requests, policies)]
    assert batched == single == [Verdict.PERMIT, Verdict.DENY, Verdict.DENY, Verdict.PERMIT]


def test_identical_requests_in_a_batch_are_decided_once(
    catalog: Catalog, policies: PolicySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of repeats asks Cedar each distinct question once; every call still gets
    the decision it would get alone, in order."""
    refund = catalog.get("propose_refund")
    assert refund is not None
    asked: list[int] = []
    real = cedarpy.is_authorized_batch

    def counting(requests: list[Any], *args: Any) -> Any:
        asked.append(len(requests))
        return real(requests, *args)

    monkeypatch.setattr(cedarpy, "is_authorized_batch", counting)

    def request(roles: tuple[str, ...], amount: int) -> AuthorizationRequest:
        return AuthorizationRequest(
            actor=Actor(sub="u", tenant="tenant-a", roles=roles),
            tool=refund,
            resource=PAYMENT_A,
            arguments={"payment_id": "pay_A1001", "amount_minor": amount, "reason": "r"},
        )

    requests = [
        request(("refund",), 4000),
        request(("refund",), 4000),
        request(("refund",), 999_999),  # over the refundable amount: denied
        request(("refund",), 4000),
        request(("refund",), 999_999),
    ]
    fresh = dataclasses.replace(policies)  # no answers kept from other tests
    batched = authorize_batch(requests, fresh)
    assert asked == [2]  # one evaluation, of the two distinct requests
    asked.clear()
    assert batched == one_by_one(requests, dataclasses.replace(policies))
    permit, deny = Verdict.PERMIT, Verdict.DENY
    assert [d.verdict for d in batched] == [permit, permit, deny, permit, deny]

    # Asked again under the same set (the executor's commit-time re-check of what the
    # authorizer decided, a read repeated): the kept answers, Cedar not asked.
    asked.clear()
    assert authorize_batch(requests, fresh) == batched
    assert asked == []
    # The resource changed (less refundable): its entities differ, so Cedar is asked again
    # and answers for the fresh resource.
    changed = PAYMENT_A.model_copy(
        update={"attributes": {**PAYMENT_A.attributes, "refundable_minor": 1000}}
    )
    smaller = [dataclasses.replace(r, resource=changed) for r in requests[:2]]
    assert [d.verdict for d in authorize_batch(smaller, fresh)] == [deny, deny]
    assert asked == [1]
    # Another policy set (even a copy of this one) keeps answers of its own.
    asked.clear()
    authorize_batch(requests, dataclasses.replace(fresh))
    assert asked == [2]


def test_resource_not_matching_schema_fails_closed(catalog: Catalog, policies: PolicySet) -> None:
    partial = Resource(
        kind="payment", id="pay_A1001", tenant="tenant-a", attributes={"refundable_minor": 4900}
    )
    decision = decide(
        catalog, policies, "get_payment", {"payment_id": "pay_A1001"}, resource=partial
    )
    assert decision.verdict is Verdict.DENY
