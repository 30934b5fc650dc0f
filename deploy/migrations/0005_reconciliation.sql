-- Reconciliation schedule, kept with the ledger entry so that a restart neither loses nor
-- repeats it.
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS reconcile_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS next_check_at timestamptz;
ALTER TABLE command_ledger ADD COLUMN IF NOT EXISTS escalated_at timestamptz;
