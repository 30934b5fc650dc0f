INSERT INTO command_ledger (tenant, idempotency_key, operation_id, call_id, tool, fingerprint, status, fencing, attempts)
VALUES (%(tenant)s, %(idempotency_key)s, %(operation_id)s, %(call_id)s, %(tool)s, %(fingerprint)s, 'running', %(fencing)s, 1)
ON CONFLICT (tenant, idempotency_key) DO NOTHING
RETURNING status
