-- Operations-wide: settled outcomes still owed to a call (for `ratifier ops unknown`).
SELECT count(*) AS owed, COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
       AS oldest_age_seconds
FROM settlement_outbox
WHERE published_at IS NULL
