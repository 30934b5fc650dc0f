-- Outbox ids are global; the rows were selected (and locked) by owed_outcomes.
UPDATE settlement_outbox SET published_at = now()
WHERE id = ANY(%(ids)s) AND published_at IS NULL
