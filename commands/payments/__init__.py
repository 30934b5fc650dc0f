"""The reference domain (SaaS support refunds): argument models, loaders and handlers.

Every query carries the tenant in its WHERE; absent and foreign resources look the same.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from commands.catalog import (
    Connection,
    EffectRequest,
    ExecutionContext,
    ExternalEffect,
    HandlerResult,
    Resource,
    ResourceFacts,
    Secret,
    Tool,
    ToolArguments,
)
from commands.payments.provider_client import PaymentProvider
from commands.sql import named_query
from schemas.envelopes import Actor, Effect
from schemas.errors import ConfigurationError, PreconditionFailed, ResourceNotFound
from schemas.settings import Settings

PaymentId = Annotated[str, StringConstraints(pattern=r"^pay_[0-9A-Za-z]+$", max_length=64)]
RefundId = Annotated[str, StringConstraints(pattern=r"^re_[0-9A-Za-z]+$", max_length=64)]
PaymentMethodId = Annotated[str, StringConstraints(pattern=r"^pm_[0-9A-Za-z]+$", max_length=64)]
# Amounts are integers in minor units; the bound keeps them far inside int64.
AmountMinor = Annotated[int, Field(gt=0, le=10**12)]

_PKG = __name__


class GetPaymentArguments(ToolArguments):
    payment_id: PaymentId


class GetRefundPolicyArguments(ToolArguments):
    pass


class ProposeRefundArguments(ToolArguments):
    payment_id: PaymentId
    amount_minor: AmountMinor
    reason: Annotated[str, StringConstraints(min_length=1, max_length=300)]


class GetRefundStatusArguments(ToolArguments):
    refund_id: RefundId


class DeletePaymentMethodArguments(ToolArguments):
    payment_method_id: PaymentMethodId


# An IBAN-shaped bank account number: country, check digits, 10 to 30 letters and digits.
AccountNumber = Annotated[
    str, StringConstraints(pattern=r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}$", max_length=34)
]


class AddPayoutAccountArguments(ToolArguments):
    payment_id: PaymentId
    account_holder: Annotated[str, StringConstraints(min_length=1, max_length=140)]
    # Secret: masked in previews, approval requests and the audit log; only its last four
    # characters are stored.
    account_number: AccountNumber = Secret()


class PaymentFacts(ResourceFacts):
    kind = "payment"
    customer_email: str
    amount_minor: int
    currency: str
    refundable_minor: int
    status: str


class RefundFacts(ResourceFacts):
    kind = "refund"
    payment_id: str
    amount_minor: int
    currency: str
    reason: str
    status: str
    provider_ref: str | None = None


class RefundPolicyFacts(ResourceFacts):
    kind = "refund_policy"
    max_days: int
    auto_approve_max_minor: int
    currency: str


class PaymentMethodFacts(ResourceFacts):
    kind = "payment_method"
    brand: str
    last4: str


async def _fetch_one(conn: Connection, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    async with conn.cursor() as cur:
        await cur.execute(named_query(_PKG, name), params)
        row = await cur.fetchone()
    return dict(row) if row is not None else None


async def load_payment(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    query = "payment_by_id_for_update" if for_update else "payment_by_id"
    row = await _fetch_one(conn, query, {"tenant": tenant, "payment_id": args.payment_id})
    if row is None:
        return None
    return Resource(
        kind="payment",
        id=row.pop("payment_id"),
        tenant=row.pop("tenant"),
        attributes=row,
    )


async def load_refund_policy(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await _fetch_one(conn, "refund_policy_by_tenant", {"tenant": tenant})
    if row is None:
        return None
    return Resource(kind="refund_policy", id=tenant, tenant=row.pop("tenant"), attributes=row)


async def load_refund(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    row = await _fetch_one(conn, "refund_by_id", {"tenant": tenant, "refund_id": args.refund_id})
    if row is None:
        return None
    return Resource(
        kind="refund", id=row.pop("refund_id"), tenant=row.pop("tenant"), attributes=row
    )


async def load_payment_method(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    tenant = actor.tenant
    query = "payment_method_by_id_for_update" if for_update else "payment_method_by_id"
    row = await _fetch_one(
        conn, query, {"tenant": tenant, "payment_method_id": args.payment_method_id}
    )
    if row is None:
        return None
    return Resource(
        kind="payment_method",
        id=row.pop("payment_method_id"),
        tenant=row.pop("tenant"),
        attributes=row,
    )


def _require(ctx: ExecutionContext) -> Resource:
    if ctx.resource is None:
        raise ResourceNotFound()
    return ctx.resource


async def read_resource(ctx: ExecutionContext) -> HandlerResult:
    """Reads return the resource the executor re-loaded inside its transaction."""
    resource = _require(ctx)
    return HandlerResult(result={"id": resource.id, **resource.attributes}, resource_id=resource.id)


async def propose_refund(ctx: ExecutionContext) -> HandlerResult:
    """Prepare the refund inside the ledger's transaction: reserve the refundable amount and
    record the refund as pending. The result is the payload sent to the provider."""
    payment = _require(ctx)
    args = ctx.arguments
    assert isinstance(args, ProposeRefundArguments)
    refund_id = "re_" + hashlib.sha256(ctx.operation_id.encode()).hexdigest()[:20]
    reserved = await _fetch_one(
        ctx.conn,
        "reserve_refundable",
        {"tenant": ctx.tenant, "payment_id": args.payment_id, "amount_minor": args.amount_minor},
    )
    if reserved is None:
        raise PreconditionFailed()
    async with ctx.conn.cursor() as cur:
        await cur.execute(
            named_query(_PKG, "insert_refund"),
            {
                "tenant": ctx.tenant,
                "refund_id": refund_id,
                "payment_id": args.payment_id,
                "operation_id": ctx.operation_id,
                "amount_minor": args.amount_minor,
                "currency": payment.attributes["currency"],
                "reason": args.reason,
            },
        )
    return HandlerResult(
        result={
            "refund_id": refund_id,
            "payment_id": args.payment_id,
            "amount_minor": args.amount_minor,
            "currency": payment.attributes["currency"],
        },
        resource_id=refund_id,
    )


_provider: PaymentProvider | None = None


def _client() -> PaymentProvider:
    if _provider is None:
        raise ConfigurationError("the payments catalog was not started")
    return _provider


async def start_payments(settings: Settings) -> None:
    global _provider  # noqa: PLW0603 - one client per process, opened by the catalog
    _provider = PaymentProvider(settings.provider_url)


async def stop_payments() -> None:
    global _provider  # noqa: PLW0603
    if _provider is not None:
        await _provider.close()
        _provider = None


def _refund_result(payload: dict[str, Any], provider_ref: str) -> HandlerResult:
    return HandlerResult(
        result={**payload, "provider_ref": provider_ref, "status": "succeeded"},
        resource_id=str(payload["refund_id"]),
    )


async def send_refund(request: EffectRequest) -> HandlerResult:
    """Ask the provider to pay the refund; the operation id is its idempotency key."""
    payload = request.payload
    refund = await _client().create_refund(
        idempotency_key=request.operation_id,
        tenant=request.tenant,
        payment_id=str(payload["payment_id"]),
        amount_minor=int(payload["amount_minor"]),
        currency=str(payload["currency"]),
    )
    return _refund_result(payload, refund.id)


async def find_refund(request: EffectRequest) -> HandlerResult | None:
    """The reconcile hook: did the provider apply this operation?"""
    refund = await _client().find_refund(request.operation_id)
    return _refund_result(request.payload, refund.id) if refund is not None else None


async def settle_refund(conn: Connection, request: EffectRequest, done: HandlerResult) -> None:
    async with conn.cursor() as cur:
        await cur.execute(
            named_query(_PKG, "settle_refund"),
            {
                "tenant": request.tenant,
                "operation_id": request.operation_id,
                "provider_ref": done.result.get("provider_ref"),
            },
        )


async def release_refund(conn: Connection, request: EffectRequest) -> None:
    """The provider definitely did not pay: give the reserved amount back, once."""
    failed = await _fetch_one(
        conn, "fail_refund", {"tenant": request.tenant, "operation_id": request.operation_id}
    )
    if failed is None:
        return  # already settled or released
    async with conn.cursor() as cur:
        await cur.execute(
            named_query(_PKG, "restore_refundable"),
            {"tenant": request.tenant, **failed},
        )


async def add_payout_account(ctx: ExecutionContext) -> HandlerResult:
    """Attach a bank account to the payment for its refund. The account number itself is
    never stored or returned: its last four characters identify it to people."""
    payment = _require(ctx)
    args = ctx.arguments
    assert isinstance(args, AddPayoutAccountArguments)
    payout_account_id = "pa_" + hashlib.sha256(ctx.operation_id.encode()).hexdigest()[:20]
    last4 = args.account_number[-4:]
    async with ctx.conn.cursor() as cur:
        await cur.execute(
            named_query(_PKG, "insert_payout_account"),
            {
                "tenant": ctx.tenant,
                "payout_account_id": payout_account_id,
                "payment_id": payment.id,
                "operation_id": ctx.operation_id,
                "account_holder": args.account_holder,
                "account_last4": last4,
            },
        )
    return HandlerResult(
        result={
            "payout_account_id": payout_account_id,
            "payment_id": payment.id,
            "account_last4": last4,
        },
        resource_id=payout_account_id,
    )


async def delete_payment_method(ctx: ExecutionContext) -> HandlerResult:
    method = _require(ctx)
    async with ctx.conn.cursor() as cur:
        await cur.execute(
            named_query(_PKG, "delete_payment_method"),
            {"tenant": ctx.tenant, "payment_method_id": method.id},
        )
    return HandlerResult(result={"deleted": method.id}, resource_id=method.id)


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="get_payment",
        description="Look up one payment of the caller's tenant by its id.",
        arguments=GetPaymentArguments,
        effect=Effect.READ,
        load=load_payment,
        resource=PaymentFacts,
        handler=read_resource,
    ),
    Tool(
        name="get_refund_policy",
        description="Read the caller's tenant refund policy.",
        arguments=GetRefundPolicyArguments,
        effect=Effect.READ,
        load=load_refund_policy,
        resource=RefundPolicyFacts,
        handler=read_resource,
    ),
    Tool(
        name="propose_refund",
        description=(
            "Propose a refund of part or all of a payment, in minor units. "
            "A human approves it before it is sent to the payment provider."
        ),
        arguments=ProposeRefundArguments,
        effect=Effect.EXTERNAL_WRITE,
        load=load_payment,
        resource=PaymentFacts,
        handler=propose_refund,
        external=ExternalEffect(
            invoke=send_refund, settle=settle_refund, release=release_refund, lookup=find_refund
        ),
    ),
    Tool(
        name="get_refund_status",
        description="Read the status of a refund of the caller's tenant.",
        arguments=GetRefundStatusArguments,
        effect=Effect.READ,
        load=load_refund,
        resource=RefundFacts,
        handler=read_resource,
    ),
    Tool(
        name="add_payout_account",
        description=(
            "Attach a bank account to a payment, to receive its refund when the card cannot. "
            "A human approves it. The account number is secret: it is never shown back."
        ),
        arguments=AddPayoutAccountArguments,
        effect=Effect.REVERSIBLE_WRITE,
        load=load_payment,
        resource=PaymentFacts,
        handler=add_payout_account,
    ),
    Tool(
        name="delete_payment_method",
        description="Delete a stored payment method. Denied by default policy.",
        arguments=DeletePaymentMethodArguments,
        effect=Effect.DESTRUCTIVE,
        load=load_payment_method,
        resource=PaymentMethodFacts,
        handler=delete_payment_method,
    ),
)
