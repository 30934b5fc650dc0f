UPDATE command_ledger
SET status = %(status)s, outcome = %(outcome)s, updated_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
