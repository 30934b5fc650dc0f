-- Reserve an operation's amount (once per budget and operation: a repeat changes nothing).
INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, amount, state, reserved_at)
VALUES (%(tenant)s, %(budget)s, %(operation_id)s, %(scope_key)s, %(window_key)s, %(amount)s,
        'reserved', %(reserved_at)s)
ON CONFLICT (tenant, budget, operation_id) DO NOTHING
RETURNING amount
