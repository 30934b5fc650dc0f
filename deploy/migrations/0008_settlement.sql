-- Every call answered `unknown` for an operation, recorded in the transaction that answered
-- it: reconciliation publishes the operation's settled outcome to each of them, not only to
-- the call that started the operation (a retry with the same idempotency key waits too).
CREATE TABLE IF NOT EXISTS unknown_calls (
    tenant           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    call_id          text        NOT NULL,
    trace_id         text,
    answered_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key, call_id)
);

-- Settlement outbox: the outcomes a settlement (or an escalation) owes, one per waiting call,
-- written in the settlement's transaction; published, acknowledged by the broker, then
-- marked. A crash between commit and publish leaves them unmarked, and they are published
-- again (an identical outcome under the same call id: readers dedupe by call id).
CREATE TABLE IF NOT EXISTS settlement_outbox (
    id            bigserial   PRIMARY KEY,
    tenant        text        NOT NULL,
    operation_id  text        NOT NULL,
    call_id       text        NOT NULL,
    outcome       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS settlement_outbox_unpublished ON settlement_outbox (id)
    WHERE published_at IS NULL;

-- Why an operation still waits (`ratifier ops unknown`): the result of its last check.
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS last_check text;
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS last_checked_at timestamptz;
