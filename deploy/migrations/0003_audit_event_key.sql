-- Audit rows written by at-least-once consumers carry the source record's identity, so that a
-- redelivered record is recorded once.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS event_key text;
CREATE UNIQUE INDEX IF NOT EXISTS audit_log_event_key ON audit_log (event_key)
    WHERE event_key IS NOT NULL;
