DELETE FROM approval_requests
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s AND call_id = %(call_id)s
