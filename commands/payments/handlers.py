"""Handlers: what each tool does, inside the executor's transaction (its SQL in ``sql/``),
and the external effect of a refund through the payment provider."""

from __future__ import annotations

import hashlib
from typing import Any

from commands.catalog import (
    Connection,
    EffectRequest,
    ExecutionContext,
    HandlerResult,
    Resource,
)
from commands.payments.loaders import fetch_one
from commands.payments.models import AddPayoutAccountArguments, ProposeRefundArguments
from commands.payments.provider_client import PaymentProvider
from commands.sql import named_query
from config.settings import Settings
from schemas.errors import ConfigurationError, PreconditionFailed, ResourceNotFound

_PKG = __name__.rpartition(".")[0]


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
    reserved = await fetch_one(
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
    failed = await fetch_one(
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
