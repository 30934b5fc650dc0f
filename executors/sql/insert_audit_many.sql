-- Many calls' audit rows of one kind in one statement, passed as one JSON array of
-- {tenant, call_id, detail} (one parameter to encode; a jsonb[] is encoded element by element).
INSERT INTO audit_log (tenant, call_id, kind, detail)
SELECT a.tenant, a.call_id, %(kind)s, a.detail
FROM jsonb_to_recordset(%(rows)s::jsonb) AS a(tenant text, call_id text, detail jsonb)
