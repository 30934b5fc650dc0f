SELECT id, at, tenant, kind, detail
FROM audit_log
WHERE call_id = %(call_id)s
  AND (%(tenant)s::text IS NULL OR tenant IS NULL OR tenant = %(tenant)s)
ORDER BY at, id
