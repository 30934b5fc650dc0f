DELETE FROM unknown_calls
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
