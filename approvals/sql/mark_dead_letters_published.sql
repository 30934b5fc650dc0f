UPDATE notification_deliveries
   SET dead_letter_published_at = now()
 WHERE tenant = %(tenant)s AND delivery_id = ANY(%(delivery_ids)s)
   AND dead_letter_published_at IS NULL
