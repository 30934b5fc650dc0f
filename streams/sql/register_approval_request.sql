INSERT INTO approval_requests (tenant, idempotency_key, call_id, fingerprint)
VALUES (%(tenant)s, %(idempotency_key)s, %(call_id)s, %(fingerprint)s)
ON CONFLICT (tenant, idempotency_key) DO NOTHING
