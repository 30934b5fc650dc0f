UPDATE command_ledger
SET status = %(status)s, outcome = %(outcome)s, updated_at = now(), next_check_at = NULL,
    last_check = %(last_check)s, last_checked_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s AND status = 'unknown'
RETURNING status
