SELECT call_id, trace_id, reply_to
FROM unknown_calls
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
ORDER BY answered_at, call_id
