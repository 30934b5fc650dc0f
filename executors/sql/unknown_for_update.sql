SELECT tenant, idempotency_key, operation_id, call_id, tool, fingerprint, status, fencing,
       outcome, effect, reconcile_attempts
FROM command_ledger
WHERE tenant = %(tenant)s AND operation_id = %(operation_id)s AND status = 'unknown'
FOR UPDATE
