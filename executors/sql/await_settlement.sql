-- A call answered `unknown` for this operation: it is owed the operation's settled outcome.
INSERT INTO unknown_calls (tenant, idempotency_key, call_id, trace_id)
VALUES (%(tenant)s, %(idempotency_key)s, %(call_id)s, %(trace_id)s)
ON CONFLICT (tenant, idempotency_key, call_id) DO NOTHING
