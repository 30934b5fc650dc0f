INSERT INTO audit_log (tenant, call_id, kind, detail)
VALUES (%(tenant)s, %(call_id)s, %(kind)s, %(detail)s)
