-- A call's notifications (tests, operators).
SELECT delivery_id, endpoint, kind, status, attempts, last_status, last_error, delivered_at,
       dead_at, dead_letter_published_at
  FROM notification_deliveries
 WHERE tenant = %(tenant)s AND call_id = %(call_id)s
 ORDER BY endpoint, kind
