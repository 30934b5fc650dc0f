-- Claim this tenant's due deliveries: count the attempt and lease the row until the attempt
-- must have ended (a notifier that dies mid-send leaves it due again after the lease).
-- SKIP LOCKED: notifiers running side by side never claim the same row.
UPDATE notification_deliveries AS d
   SET attempts = d.attempts + 1,
       next_attempt_at = now() + make_interval(secs => %(lease_seconds)s)
  FROM (
      SELECT delivery_id
        FROM notification_deliveries
       WHERE tenant = %(tenant)s AND status = 'pending' AND next_attempt_at <= now()
       ORDER BY next_attempt_at
       LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED
  ) AS due
 WHERE d.tenant = %(tenant)s AND d.delivery_id = due.delivery_id
RETURNING d.delivery_id, d.call_id, d.endpoint, d.kind, d.body, d.attempts, d.created_at
