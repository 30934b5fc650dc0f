UPDATE command_ledger
SET reconcile_attempts = reconcile_attempts + 1,
    next_check_at = now() + make_interval(secs => %(delay)s),
    escalated_at = CASE WHEN %(escalate)s THEN now() ELSE escalated_at END,
    last_check = %(last_check)s,
    last_checked_at = now(),
    updated_at = now()
WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s AND status = 'unknown'
