UPDATE command_ledger
SET status = 'effect_pending', effect = %(effect)s, fencing = %(fencing)s, updated_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
