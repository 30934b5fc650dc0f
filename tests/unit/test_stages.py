from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from commands.catalog import Catalog, Resource, Tool, ToolArguments
from commands.policy import PolicySet
from commands.validate import Limits
from schemas.envelopes import (
    DEAD_LETTER_PREFIX_BYTES,
    Actor,
    ApprovalRequest,
    AuthorizedCall,
    CommittedCommand,
    DeadLetter,
    Outcome,
    SourcePosition,
    Status,
    ValidatedCall,
)
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from schemas.names import Topic
from streams.approval import Rules, on_authorized
from streams.authorizer import on_validated
from streams.validator import on_proposed
from tests.unit.conftest import KEYS, NOW, PAYMENT_ATTRS, SIGNING, token

SOURCE = SourcePosition(topic="ratifier.calls.proposed", partition=3, offset=42)


def proposed(**overrides: Any) -> bytes:
    body = {
        "v": 1,
        "call_id": "c-1",
        "tool": "get_payment",
        "arguments": {"payment_id": "pay_A1001"},
        "context": token(),
        "proposed_at": NOW.isoformat(),
    }
    body.update(overrides)
    return json.dumps(body).encode()


def test_validator_passes_valid_call_on(catalog: Catalog) -> None:
    (emit,) = on_proposed(
        proposed(), source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id="t" * 32
    )
    assert emit.topic is Topic.VALIDATED
    assert isinstance(emit.value, ValidatedCall)
    assert emit.value.idempotency_key == "c-1"
    assert emit.key == "c-1"


def test_validator_keeps_the_proposal_s_tenant_lane(catalog: Catalog) -> None:
    """v1.7: a proposal keyed by its tenant's lane gives a calls.validated record keyed by
    the same lane (the authorizer then reads a tenant on its partitions)."""
    from schemas.lanes import proposal_key

    lane = proposal_key(token(), call_id="c-1")
    (emit,) = on_proposed(
        proposed(),
        source=SOURCE,
        key=lane,
        catalog=catalog,
        limits=Limits(),
        now=NOW,
        trace_id=None,
    )
    assert emit.topic is Topic.VALIDATED
    assert emit.key == lane != "c-1"


def test_malformed_goes_to_deadletter_with_raw_bytes_and_outcome(catalog: Catalog) -> None:
    raw = proposed(v=7)
    letter, rejected = on_proposed(
        raw, source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id=None
    )
    assert letter.topic is Topic.DEADLETTER
    assert isinstance(letter.value, DeadLetter)
    assert base64.b64decode(letter.value.raw_base64) == raw
    assert letter.value.source == SOURCE
    assert isinstance(rejected.value, Outcome)
    assert rejected.value.error is not None
    assert rejected.value.error.code is ErrorCode.MALFORMED


def test_unrecoverable_garbage_is_only_deadlettered(catalog: Catalog) -> None:
    emits = on_proposed(
        b"\x00\x01", source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id=None
    )
    assert [e.topic for e in emits] == [Topic.DEADLETTER]


def validated(
    tenant: str = "tenant-a", roles: tuple[str, ...] = ("support",), **kw: Any
) -> ValidatedCall:
    body: dict[str, Any] = {
        "call_id": "c-1",
        "idempotency_key": "k-1",
        "tool": "get_payment",
        "arguments": {"payment_id": "pay_A1001"},
        "context": token(tenant=tenant, roles=roles),
        "proposed_at": NOW,
        "validated_at": NOW,
    }
    body.update(kw)
    return ValidatedCall(**body)


class FakeStore:
    def __init__(self, *resources: Resource) -> None:
        self.resources = {(r.tenant, r.id): r for r in resources}
        self.asked: list[tuple[str, str]] = []

    async def fetch(self, tool: Tool, actor: Actor, args: ToolArguments) -> Resource | None:
        ident = str(getattr(args, "payment_id", getattr(args, "payment_method_id", "")))
        self.asked.append((actor.tenant, ident))
        return self.resources.get((actor.tenant, ident))


PAYMENT = Resource(kind="payment", id="pay_A1001", tenant="tenant-a", attributes=PAYMENT_ATTRS)


async def test_authorizer_uses_tenant_from_token_only(
    catalog: Catalog, policies: PolicySet
) -> None:
    store = FakeStore(PAYMENT)
    (emit,) = await on_validated(
        validated(), catalog=catalog, keys=KEYS, policies=policies, fetch=store.fetch, now=NOW
    )
    assert isinstance(emit.value, CommittedCommand)  # a read: the authorizer commits it
    assert emit.value.operation_id == "tenant-a:k-1"
    assert emit.value.fingerprint == fingerprint(
        tenant="tenant-a",
        tool="get_payment",
        arguments={"payment_id": "pay_A1001"},
        policy_version=policies.version,
    )
    (denied,) = await on_validated(
        validated(tenant="tenant-b"),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=store.fetch,
        now=NOW,
    )
    assert isinstance(denied.value, Outcome)
    assert denied.value.status is Status.DENIED
    assert denied.value.error is not None and denied.value.error.code is ErrorCode.NOT_FOUND
    assert store.asked == [("tenant-a", "pay_A1001"), ("tenant-b", "pay_A1001")]


async def test_forged_context_is_unauthenticated_and_loads_nothing(
    catalog: Catalog, policies: PolicySet
) -> None:
    store = FakeStore(PAYMENT)
    (emit,) = await on_validated(
        validated(context="forged.token.here"),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=store.fetch,
        now=NOW,
    )
    assert isinstance(emit.value, Outcome)
    assert emit.value.tenant is None
    assert emit.value.error is not None
    assert emit.value.error.code is ErrorCode.UNAUTHENTICATED
    assert store.asked == []


async def test_refund_goes_to_approval(catalog: Catalog, policies: PolicySet) -> None:
    call = validated(
        roles=("refund",),
        tool="propose_refund",
        arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
    )
    (emit,) = await on_validated(
        call, catalog=catalog, keys=KEYS, policies=policies, fetch=FakeStore(PAYMENT).fetch, now=NOW
    )
    assert isinstance(emit.value, AuthorizedCall)
    request, waiting = on_authorized(
        None, emit.value, tool=catalog.get(emit.value.tool), now=NOW, rules=Rules(keys=SIGNING)
    ).emits
    assert isinstance(request.value, ApprovalRequest)
    assert request.value.fingerprint == emit.value.fingerprint
    assert request.value.expires_at > NOW
    assert any("amount_minor: 100" in line for line in request.value.preview)
    assert isinstance(waiting.value, Outcome)
    assert waiting.value.status is Status.AWAITING_APPROVAL


async def test_auto_route_commits_keyed_by_operation(catalog: Catalog, policies: PolicySet) -> None:
    (committed,) = await on_validated(
        validated(),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=FakeStore(PAYMENT).fetch,
        now=NOW,
    )
    assert committed.topic is Topic.COMMITTED  # and no `calls.authorized` record (v1.8)
    assert committed.key == "tenant-a:k-1"
    assert isinstance(committed.value, CommittedCommand)
    assert committed.value.idempotency_key == "k-1"


def test_dead_letter_of_an_oversized_record_keeps_digest_size_and_a_bounded_prefix() -> None:
    raw = b"x" * 900_000
    letter = DeadLetter.of_raw(raw, reason="too large", call_id=None, source=SOURCE, at=NOW)
    assert letter.raw_size == 900_000
    assert letter.raw_truncated
    assert letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
    assert base64.b64decode(letter.raw_base64) == raw[:DEAD_LETTER_PREFIX_BYTES]
    assert len(letter.to_bytes()) < 2 * DEAD_LETTER_PREFIX_BYTES
