-- Deliveries whose request expired before they got through: nothing left to decide.
UPDATE notification_deliveries
   SET status = 'expired', last_error = coalesce(last_error, 'request expired')
 WHERE tenant = %(tenant)s AND status = 'pending' AND expires_at <= now()
