INSERT INTO settlement_outbox (tenant, operation_id, call_id, outcome)
VALUES (%(tenant)s, %(operation_id)s, %(call_id)s, %(outcome)s)
