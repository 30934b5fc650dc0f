-- Operations of this deployment whose outcome is unknown (being reconciled or escalated to
-- humans), and recently settled ones that went through reconciliation.
SELECT l.tenant, l.operation_id, l.call_id, l.tool, l.status, l.reconcile_attempts,
       l.next_check_at, l.escalated_at, l.created_at, l.updated_at,
       l.outcome->'error'->>'code' AS error_code
FROM command_ledger l
WHERE (%(tenant)s::text IS NULL OR l.tenant = %(tenant)s)
  AND (l.status = 'unknown'
       OR (l.updated_at >= %(since)s AND EXISTS (
             SELECT 1 FROM audit_log h
             WHERE h.tenant = l.tenant AND h.call_id = l.call_id
               AND h.kind IN ('reconciled', 'escalated', 'resolved_by_human'))))
  AND EXISTS (
      SELECT 1 FROM audit_records a
      WHERE a.prefix = %(prefix)s AND a.call_id = l.call_id AND a.tenant = l.tenant
  )
ORDER BY (l.status = 'unknown') DESC, l.escalated_at DESC NULLS LAST, l.updated_at DESC
LIMIT %(limit)s
