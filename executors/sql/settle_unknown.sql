UPDATE command_ledger
SET status = %(status)s, outcome = %(outcome)s, updated_at = now(), next_check_at = NULL
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s AND status = 'unknown'
RETURNING status
