-- Latency per stage and end to end, per call, from the Kafka timestamps of the records each
-- stage wrote; p50/p95/p99 in milliseconds over the calls proposed within the window.
-- End to end is the terminal outcome's `at` minus the proposal's `proposed_at` (as the
-- validator read it; the proposal's record time when it never validated). A call the
-- authorizer commits itself has no `calls.authorized` record since contract v1.8: its
-- authorization ends with its command, and it has no approve & commit span.
WITH marks AS (
    SELECT call_id,
           min(record_at) FILTER (WHERE stream = 'calls.proposed') AS proposed,
           min(record_at) FILTER (WHERE stream = 'calls.validated') AS validated,
           min(record_at) FILTER (WHERE stream = 'calls.authorized') AS authorized,
           min(record_at) FILTER (WHERE stream = 'commands.committed') AS committed,
           min(record_at) FILTER (WHERE stream = 'outcomes'
                                    AND status IS DISTINCT FROM 'awaiting_approval') AS ended,
           min(record->>'proposed_at') FILTER (WHERE stream = 'calls.validated') AS proposed_at,
           min(record->>'at') FILTER (WHERE stream = 'outcomes'
                                        AND status IS DISTINCT FROM 'awaiting_approval') AS ended_at,
           max(tenant) AS tenant,
           max(tool) FILTER (WHERE stream = 'outcomes') AS tool
    FROM audit_records
    WHERE prefix = %(prefix)s AND call_id IS NOT NULL AND record_at >= %(since)s
      AND stream IN ('calls.proposed', 'calls.validated', 'calls.authorized',
                     'commands.committed', 'outcomes')
    GROUP BY call_id
),
chosen AS (
    SELECT * FROM marks
    WHERE proposed IS NOT NULL
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(tool)s::text IS NULL OR tool = %(tool)s)
),
spans AS (
    SELECT 'validate' AS stage, validated - proposed AS took FROM chosen
    UNION ALL SELECT 'authorize', coalesce(authorized, committed) - validated FROM chosen
    UNION ALL SELECT 'approve_commit', committed - authorized FROM chosen
    UNION ALL SELECT 'execute', ended - committed FROM chosen
    UNION ALL
    SELECT 'end_to_end',
           (CASE WHEN ended_at ~ '^\d{4}-\d{2}-\d{2}T' THEN ended_at::timestamptz END)
           - coalesce(CASE WHEN proposed_at ~ '^\d{4}-\d{2}-\d{2}T'
                           THEN proposed_at::timestamptz END, proposed)
    FROM chosen
)
SELECT stage, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM took) * 1000) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM took) * 1000) AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM took) * 1000) AS p99
FROM spans
WHERE took IS NOT NULL
GROUP BY stage
