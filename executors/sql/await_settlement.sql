-- A call answered `unknown` for this operation: it is owed the operation's settled outcome
-- (at its reply address too, when it has one).
INSERT INTO unknown_calls (tenant, idempotency_key, call_id, trace_id, reply_to)
VALUES (%(tenant)s, %(idempotency_key)s, %(call_id)s, %(trace_id)s, %(reply_to)s)
ON CONFLICT (tenant, idempotency_key, call_id) DO NOTHING
