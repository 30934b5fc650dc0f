UPDATE command_ledger
SET status = 'unknown', fencing = fencing + 1, outcome = %(outcome)s, updated_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
  AND status = 'effect_pending' AND fencing = %(fencing)s
RETURNING fencing
