"""The reference catalog: its tools, each naming its arguments, effect, loader, facts and
handler, and the `Catalog` that carries them with the domain's lifecycle and migrations."""

from __future__ import annotations

from pathlib import Path

from commands.catalog import Catalog, ExternalEffect, Tool
from commands.payments.handlers import (
    add_payout_account,
    delete_payment_method,
    find_refund,
    propose_refund,
    read_resource,
    release_refund,
    send_refund,
    settle_refund,
    start_payments,
    stop_payments,
)
from commands.payments.loaders import (
    load_payment,
    load_payment_method,
    load_payments,
    load_refund,
    load_refund_policies,
    load_refund_policy,
    load_refunds,
)
from commands.payments.models import (
    AddPayoutAccountArguments,
    DeletePaymentMethodArguments,
    GetPaymentArguments,
    GetRefundPolicyArguments,
    GetRefundStatusArguments,
    PaymentFacts,
    PaymentMethodFacts,
    ProposeRefundArguments,
    RefundFacts,
    RefundPolicyFacts,
)
from schemas.envelopes import Effect

TOOLS: tuple[Tool, ...] = (
    Tool(
        name="get_payment",
        description="Look up one payment of the caller's tenant by its id.",
        arguments=GetPaymentArguments,
        effect=Effect.READ,
        load=load_payment,
        load_many=load_payments,
        resource=PaymentFacts,
        handler=read_resource,
    ),
    Tool(
        name="get_refund_policy",
        description="Read the caller's tenant refund policy.",
        arguments=GetRefundPolicyArguments,
        effect=Effect.READ,
        load=load_refund_policy,
        load_many=load_refund_policies,
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
        load_many=load_payments,
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
        load_many=load_refunds,
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
        load_many=load_payments,
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

# The domain's tables and seed data are its own migrations, so only a deployment of this
# catalog gets them (recorded as ``payments/<file>``).
catalog = Catalog(
    TOOLS,
    start=start_payments,
    stop=stop_payments,
    name="payments",
    # Refunds go to the payment provider: one circuit breaker for its writes.
    provider="payments",
    migrations=Path(__file__).parent / "migrations",
)
