-- One notification owed; a redelivered approval request adds nothing (same delivery id).
INSERT INTO notification_deliveries (tenant, delivery_id, call_id, endpoint, kind, body, expires_at)
VALUES (%(tenant)s, %(delivery_id)s, %(call_id)s, %(endpoint)s, %(kind)s, %(body)s, %(expires_at)s)
ON CONFLICT (tenant, delivery_id) DO NOTHING
