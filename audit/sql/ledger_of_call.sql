SELECT tenant, idempotency_key, operation_id, call_id, tool, fingerprint, status, fencing,
       attempts, reconcile_attempts, next_check_at, escalated_at, created_at, updated_at,
       outcome, effect
FROM command_ledger
WHERE (call_id = %(call_id)s OR operation_id = ANY(%(operation_ids)s))
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY created_at
