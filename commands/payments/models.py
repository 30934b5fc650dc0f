"""The reference domain's vocabulary: the arguments each tool takes (validated before
anything runs) and the facts its loaders hand to policies."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from commands.catalog import ResourceFacts, Secret, ToolArguments

PaymentId = Annotated[str, StringConstraints(pattern=r"^pay_[0-9A-Za-z]+$", max_length=64)]
RefundId = Annotated[str, StringConstraints(pattern=r"^re_[0-9A-Za-z]+$", max_length=64)]
PaymentMethodId = Annotated[str, StringConstraints(pattern=r"^pm_[0-9A-Za-z]+$", max_length=64)]
# Amounts are integers in minor units; the bound keeps them far inside int64.
AmountMinor = Annotated[int, Field(gt=0, le=10**12)]


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
    # The paying customer confirms (or declines) a call on their payment themselves.
    owner_attribute = "customer_email"
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
