-- Approver notifications (`ratifier notifier`, docs/notifications.md): the outbox of webhook
-- deliveries. The notifier's consumer writes one row per (approval request, endpoint, kind),
-- idempotent on the delivery id, before it commits its offsets; its dispatcher sends the due
-- rows, retries them with backoff and marks them delivered, dead (after the bound) or expired
-- (the request expired first). A dead row's dead letter is published, acknowledged, then
-- marked, so a crash in between publishes it again (same delivery id).
CREATE TABLE IF NOT EXISTS notification_deliveries (
    tenant                    text        NOT NULL,
    delivery_id               text        NOT NULL,
    call_id                   text        NOT NULL,
    endpoint                  text        NOT NULL,
    kind                      text        NOT NULL CHECK (kind IN ('approver', 'confirmation')),
    -- The exact bytes sent (and signed) on every attempt: compact JSON, never a credential.
    body                      text        NOT NULL,
    expires_at                timestamptz NOT NULL,
    status                    text        NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'delivered', 'dead', 'expired')),
    attempts                  integer     NOT NULL DEFAULT 0,
    next_attempt_at           timestamptz NOT NULL DEFAULT now(),
    last_status               integer,
    last_error                text,
    created_at                timestamptz NOT NULL DEFAULT now(),
    delivered_at              timestamptz,
    dead_at                   timestamptz,
    dead_letter_published_at  timestamptz,
    PRIMARY KEY (tenant, delivery_id)
);
CREATE INDEX IF NOT EXISTS notification_deliveries_due
    ON notification_deliveries (tenant, next_attempt_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS notification_deliveries_dead_unpublished
    ON notification_deliveries (tenant, dead_at)
    WHERE status = 'dead' AND dead_letter_published_at IS NULL;
CREATE INDEX IF NOT EXISTS notification_deliveries_call
    ON notification_deliveries (tenant, call_id);
