from __future__ import annotations

from datetime import UTC, datetime

import pytest

from approvals.signing import ApprovalKeys, local_signing_key
from commands.catalog import Catalog
from commands.policy import PolicySet
from commands.reference import catalog as reference_catalog
from commands.validate import Limits
from runtime.identity import ContextKeys, issue_context_token

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEYS = ContextKeys(
    secret="unit-test-secret-that-is-long-enough!!", audience="ratifier", issuer="ratifier-local"
)


@pytest.fixture
def catalog() -> Catalog:
    return reference_catalog


@pytest.fixture
def limits() -> Limits:
    return Limits()


@pytest.fixture(scope="session")
def policies() -> PolicySet:
    return PolicySet.from_directory()


def token(
    tenant: str = "tenant-a",
    sub: str = "agent-1",
    roles: tuple[str, ...] = ("support",),
    **kwargs: object,
) -> str:
    return issue_context_token(KEYS, sub=sub, tenant=tenant, roles=roles, **kwargs)  # type: ignore[arg-type]


PAYMENT_ATTRS = {
    "customer_email": "alice@example.com",
    "amount_minor": 4900,
    "currency": "EUR",
    "refundable_minor": 4900,
    "status": "captured",
}


def _signing_keys() -> ApprovalKeys:
    key = local_signing_key("unit-test-approval-signing-seed-long-enough")
    return ApprovalKeys(
        signing_key=key,
        kid="unit-1",
        algorithm="EdDSA",
        service_keys={"unit-1": (key.public_key(), "EdDSA")},
    )


# The approval service's keys in unit tests (decisions and receipts).
SIGNING = _signing_keys()
