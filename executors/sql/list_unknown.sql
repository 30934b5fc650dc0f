SELECT l.tenant, l.operation_id, l.call_id, l.tool, l.reconcile_attempts, l.next_check_at,
       l.escalated_at, l.updated_at, l.last_check, l.last_checked_at,
       ARRAY(
           SELECT w.call_id FROM unknown_calls w
           WHERE w.tenant = l.tenant AND w.idempotency_key = l.idempotency_key
           ORDER BY w.answered_at, w.call_id
       ) AS waiting_calls
FROM command_ledger l
WHERE l.status = 'unknown' AND (%(tenant)s::text IS NULL OR l.tenant = %(tenant)s)
ORDER BY l.escalated_at NULLS LAST, l.updated_at
