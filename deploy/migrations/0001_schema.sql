-- ratifier schema: reference domain, command ledger, audit log.

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

-- The authority on "has this operation run?": unique on (tenant, idempotency key).
CREATE TABLE IF NOT EXISTS command_ledger (
    tenant           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    operation_id     text        NOT NULL,
    call_id          text        NOT NULL,
    tool             text        NOT NULL,
    fingerprint      text        NOT NULL,
    status           text        NOT NULL,
    fencing          bigint      NOT NULL DEFAULT 0,
    outcome          jsonb,
    attempts         integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key)
);

-- Append-only record of what happened, for reconstruction after the fact.
CREATE TABLE IF NOT EXISTS audit_log (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    tenant    text,
    call_id   text,
    kind      text        NOT NULL,
    detail    jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS audit_log_call ON audit_log (call_id, id);

CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS audit_log_no_change ON audit_log;
CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
