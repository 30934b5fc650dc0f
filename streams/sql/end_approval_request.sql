UPDATE approval_requests
SET outcome = %(outcome)s, ended_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s AND call_id = %(call_id)s
  AND outcome IS NULL
