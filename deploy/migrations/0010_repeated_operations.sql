-- v1.5 idempotency across approvals: which call holds an operation's (tenant + idempotency
-- key) approval request, and how the request ended when its command never ran. The
-- authorizer registers the first call of an operation that needs a human; a later call of the
-- same operation and fingerprint joins that request instead of opening another, or is told
-- the request's end (`outcome`: rejected, expired, a refused edit), written once by the
-- approval-join. Executed operations are answered from `command_ledger`
-- (docs/approvals.md, "Repeats of an operation").
CREATE TABLE IF NOT EXISTS approval_requests (
    tenant           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    call_id          text        NOT NULL,
    fingerprint      text        NOT NULL,
    outcome          jsonb,
    opened_at        timestamptz NOT NULL DEFAULT now(),
    ended_at         timestamptz,
    PRIMARY KEY (tenant, idempotency_key)
);
-- A development database may hold the table from an earlier form of this change, without
-- the request's end.
ALTER TABLE approval_requests ADD COLUMN IF NOT EXISTS outcome jsonb;
ALTER TABLE approval_requests ADD COLUMN IF NOT EXISTS ended_at timestamptz;
