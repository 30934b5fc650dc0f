-- The newest terminal outcome of one call of one tenant under this deployment's prefix (what
-- became of the call after an approver's decision was applied).
SELECT status
FROM audit_records
WHERE prefix = %(prefix)s AND stream = 'outcomes' AND call_id = %(call_id)s
  AND tenant = %(tenant)s AND status IS DISTINCT FROM 'awaiting_approval'
ORDER BY record_at DESC
LIMIT 1
