SELECT tenant, idempotency_key, operation_id, call_id, tool, fingerprint, status, fencing,
       outcome, effect
FROM command_ledger
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
FOR UPDATE
