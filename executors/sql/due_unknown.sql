SELECT tenant, idempotency_key, operation_id, call_id, tool, fingerprint, status, fencing,
       outcome, effect, reconcile_attempts
FROM command_ledger
WHERE status = 'unknown' AND escalated_at IS NULL
  AND (next_check_at IS NULL OR next_check_at <= now())
ORDER BY next_check_at NULLS FIRST
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
