UPDATE notification_deliveries
   SET next_attempt_at = %(retry_at)s, last_status = %(last_status)s, last_error = %(last_error)s
 WHERE tenant = %(tenant)s AND delivery_id = %(delivery_id)s AND status = 'pending'
