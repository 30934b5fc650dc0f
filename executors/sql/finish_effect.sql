UPDATE command_ledger
SET status = %(status)s, outcome = %(outcome)s, updated_at = now(), attempts = attempts + 1
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
  AND status = 'effect_pending' AND fencing = %(fencing)s
RETURNING status
