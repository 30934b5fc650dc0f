UPDATE notification_deliveries
   SET status = 'delivered', delivered_at = now(), last_status = %(last_status)s,
       last_error = NULL
 WHERE tenant = %(tenant)s AND delivery_id = %(delivery_id)s AND status = 'pending'
