-- Approval requests of one tenant (all tenants when %(tenant)s is null: counts only) that have
-- no terminal outcome yet, newest request per call, with the latest decision published for
-- it. Expiry is judged by dashboard.shaping.pending_requests on the validated record.
SELECT DISTINCT ON (q.call_id)
       q.call_id, q.record_at, q.record,
       d.record->>'decision' AS decision, d.record_at AS decision_at
FROM audit_records q
LEFT JOIN LATERAL (
    SELECT dec.record, dec.record_at
    FROM audit_records dec
    WHERE dec.prefix = q.prefix AND dec.stream = 'approvals.decided' AND dec.call_id = q.call_id
    ORDER BY dec.record_at DESC
    LIMIT 1
) d ON true
WHERE q.prefix = %(prefix)s AND q.stream = 'approvals.requested'
  AND q.record_at >= %(since)s
  AND (%(tenant)s::text IS NULL OR coalesce(q.tenant, q.record->>'tenant') = %(tenant)s)
  AND NOT EXISTS (
      SELECT 1 FROM audit_records o
      WHERE o.prefix = q.prefix AND o.stream = 'outcomes' AND o.call_id = q.call_id
        AND o.status IS DISTINCT FROM 'awaiting_approval'
  )
ORDER BY q.call_id, q.record_at DESC
