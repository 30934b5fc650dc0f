INSERT INTO audit_log (tenant, call_id, kind, detail, event_key)
VALUES (%(tenant)s, %(call_id)s, %(kind)s, %(detail)s, %(event_key)s)
ON CONFLICT (event_key) WHERE event_key IS NOT NULL DO NOTHING
