-- External effects: what the handler prepared (sent downstream with the operation id as its
-- idempotency key) is kept with the ledger entry, so a restart or the reconciler can finish
-- or look it up.
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS effect jsonb;
CREATE INDEX IF NOT EXISTS command_ledger_open ON command_ledger (status)
    WHERE status IN ('effect_pending', 'unknown');
