-- Dead deliveries whose dead letter the broker has not acknowledged yet.
SELECT delivery_id, call_id, endpoint, kind, attempts, last_error, created_at, dead_at
  FROM notification_deliveries
 WHERE tenant = %(tenant)s AND status = 'dead' AND dead_letter_published_at IS NULL
 ORDER BY dead_at
 LIMIT %(limit)s
