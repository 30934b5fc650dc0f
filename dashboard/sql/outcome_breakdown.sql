-- Calls per tenant, tool, status and error code within the window (also the filter choices
-- when called without filters); counted by call, so a repeated outcome counts once.
SELECT coalesce(tenant, '') AS tenant, tool, status, error_code, count(DISTINCT call_id) AS n
FROM audit_records
WHERE prefix = %(prefix)s AND stream = 'outcomes' AND record_at >= %(since)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(tool)s::text IS NULL OR tool = %(tool)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(error_code)s::text IS NULL OR error_code = %(error_code)s)
GROUP BY 1, 2, 3, 4
ORDER BY n DESC
LIMIT 2000
