-- Operations-wide (all tenants): the size and age of the reconciliation queue, for metrics.
SELECT count(*) AS size,
       count(escalated_at) AS escalated,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM command_ledger
WHERE status = 'unknown'
