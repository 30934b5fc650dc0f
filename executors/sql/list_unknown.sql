SELECT tenant, operation_id, call_id, tool, reconcile_attempts, next_check_at, escalated_at,
       updated_at
FROM command_ledger
WHERE status = 'unknown' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY escalated_at NULLS LAST, updated_at
