UPDATE notification_deliveries
   SET status = 'dead', dead_at = now(), last_status = %(last_status)s,
       last_error = %(last_error)s
 WHERE tenant = %(tenant)s AND delivery_id = %(delivery_id)s AND status = 'pending'
