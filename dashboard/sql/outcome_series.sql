-- Calls per time bucket and status (buckets aligned like dashboard.shaping.bucket_start);
-- counted by call, so an outcome repeated by a redelivery counts once.
SELECT date_bin(make_interval(secs => %(bucket_seconds)s), record_at,
                TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket,
       status, count(DISTINCT call_id) AS n
FROM audit_records
WHERE prefix = %(prefix)s AND stream = 'outcomes' AND record_at >= %(since)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(tool)s::text IS NULL OR tool = %(tool)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(error_code)s::text IS NULL OR error_code = %(error_code)s)
GROUP BY 1, 2
ORDER BY 1
