-- v1.5 idempotency across approvals: which call's approval request an operation (tenant +
-- idempotency key) waits on. The authorizer registers the first call of an operation that
-- needs a human; a later call of the same operation and fingerprint joins that request
-- instead of opening another (docs/approvals.md, "Repeats of an operation"). The approval-join
-- deletes the row when the request ends without the command running (rejected, expired,
-- refused edit), so a later call asks a human again.
CREATE TABLE IF NOT EXISTS approval_requests (
    tenant           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    call_id          text        NOT NULL,
    fingerprint      text        NOT NULL,
    opened_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key)
);
