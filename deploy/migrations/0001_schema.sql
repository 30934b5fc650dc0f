-- ratifier schema: command ledger, audit log. (The reference domain's tables, created here
-- before, are its own migrations now: commands/payments/migrations.)

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
