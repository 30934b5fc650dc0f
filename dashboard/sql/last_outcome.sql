-- When this deployment last recorded an outcome (the audit sink's freshness).
SELECT record_at, recorded_at
FROM audit_records
WHERE prefix = %(prefix)s AND stream = 'outcomes'
ORDER BY record_at DESC
LIMIT 1
