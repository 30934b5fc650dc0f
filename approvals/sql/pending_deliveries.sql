-- The tenant's deliveries still owed (a gauge) and the age of the oldest one.
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
  FROM notification_deliveries
 WHERE tenant = %(tenant)s AND status = 'pending'
