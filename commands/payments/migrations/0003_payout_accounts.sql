-- formerly: 0007_payout_accounts
-- Reference domain: bank accounts attached to a payment to receive its refund when the card
-- cannot take it. The account number is a secret argument (`Secret()`): only its last four
-- characters are kept.
CREATE TABLE IF NOT EXISTS payout_accounts (
    tenant             text        NOT NULL,
    payout_account_id  text        NOT NULL,
    payment_id         text        NOT NULL,
    operation_id       text        NOT NULL UNIQUE,
    account_holder     text        NOT NULL,
    account_last4      text        NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, payout_account_id),
    FOREIGN KEY (tenant, payment_id) REFERENCES payments (tenant, payment_id)
);
