-- The newest outcomes and approval decisions of one deployment (topic prefix), newest first.
-- Decisions carry neither tenant nor tool: they are taken from the call's approval request.
SELECT r.record_at, r.stream, r.call_id, r.kafka_partition, r.kafka_offset,
       coalesce(r.tenant, q.tenant) AS tenant, coalesce(r.tool, q.tool) AS tool,
       r.status, r.error_code, r.record
FROM audit_records r
LEFT JOIN LATERAL (
    SELECT req.tenant, req.tool
    FROM audit_records req
    WHERE r.stream = 'approvals.decided' AND req.prefix = r.prefix
      AND req.stream = 'approvals.requested' AND req.call_id = r.call_id
    ORDER BY req.record_at DESC
    LIMIT 1
) q ON true
WHERE r.prefix = %(prefix)s
  AND r.stream IN ('outcomes', 'approvals.decided')
  AND r.record_at >= %(since)s
  AND (%(tenant)s::text IS NULL OR coalesce(r.tenant, q.tenant) = %(tenant)s)
  AND (%(tool)s::text IS NULL OR coalesce(r.tool, q.tool) = %(tool)s)
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
  AND (%(error_code)s::text IS NULL OR r.error_code = %(error_code)s)
ORDER BY r.record_at DESC, r.kafka_offset DESC
LIMIT %(limit)s
