-- Operations-wide (all tenants, like the reconciliation schedule): settlement outcomes not
-- yet published, oldest first; optionally those of one operation (its tenant is part of it).
SELECT id, operation_id, call_id, outcome
FROM settlement_outbox
WHERE published_at IS NULL
  AND (%(operation_id)s::text IS NULL OR operation_id = %(operation_id)s)
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
