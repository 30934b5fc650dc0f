from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from commands.catalog import Catalog, Resource
from commands.policy import PolicySet, Verdict, authorize
from schemas.envelopes import Actor, Route
from schemas.errors import ConfigurationError, ErrorCode

PAYMENT_A = Resource(
    kind="payment",
    id="pay_A1001",
    tenant="tenant-a",
    attributes={"refundable_minor": 4900, "currency": "EUR"},
)


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
    method = Resource(kind="payment_method", id="pm_A1", tenant="tenant-a", attributes={})
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
    (tmp_path / "a.cedar").write_text("permit (principal, action, resource);")
    first = PolicySet.from_directory(tmp_path)
    assert first.version == PolicySet.from_directory(tmp_path).version
    (tmp_path / "a.cedar").write_text("forbid (principal, action, resource);")
    assert PolicySet.from_directory(tmp_path).version != first.version


def test_broken_policy_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "bad.cedar").write_text("permit (principal, action resource")
    with pytest.raises(ConfigurationError, match="does not parse"):
        PolicySet.from_directory(tmp_path)
