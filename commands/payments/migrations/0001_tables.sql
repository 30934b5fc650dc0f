-- formerly: 0001_schema
-- The reference domain's tables: payments, stored payment methods, each tenant's refund
-- policy, and refunds. (Created by ratifier's own 0001_schema before they moved here: a
-- database that applied that one has them, and does not apply this file again.)

CREATE TABLE IF NOT EXISTS payments (
    tenant            text        NOT NULL,
    payment_id        text        NOT NULL,
    customer_email    text        NOT NULL,
    amount_minor      bigint      NOT NULL CHECK (amount_minor > 0),
    currency          char(3)     NOT NULL,
    refundable_minor  bigint      NOT NULL CHECK (refundable_minor >= 0),
    status            text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, payment_id),
    CHECK (refundable_minor <= amount_minor)
);

CREATE TABLE IF NOT EXISTS payment_methods (
    tenant             text        NOT NULL,
    payment_method_id  text        NOT NULL,
    customer_email     text        NOT NULL,
    brand              text        NOT NULL,
    last4              char(4)     NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, payment_method_id)
);

CREATE TABLE IF NOT EXISTS refund_policies (
    tenant                  text    PRIMARY KEY,
    max_days                integer NOT NULL,
    auto_approve_max_minor  bigint  NOT NULL,
    currency                char(3) NOT NULL
);

CREATE TABLE IF NOT EXISTS refunds (
    tenant        text        NOT NULL,
    refund_id     text        NOT NULL,
    payment_id    text        NOT NULL,
    operation_id  text        NOT NULL UNIQUE,
    amount_minor  bigint      NOT NULL CHECK (amount_minor > 0),
    currency      char(3)     NOT NULL,
    reason        text        NOT NULL,
    status        text        NOT NULL,
    provider_ref  text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, refund_id),
    FOREIGN KEY (tenant, payment_id) REFERENCES payments (tenant, payment_id)
);
