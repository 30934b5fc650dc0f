-- Audit rows of the stream side (the approval-join's decisions, the authorizer's
-- auto-approvals), one JSON array of {tenant, call_id, kind, detail, event_key}; once per
-- source record and position in it (a redelivered batch adds nothing).
INSERT INTO audit_log (tenant, call_id, kind, detail, event_key)
SELECT a.tenant, a.call_id, a.kind, a.detail, a.event_key
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS a(tenant text, call_id text, kind text, detail jsonb, event_key text)
ON CONFLICT (event_key) WHERE event_key IS NOT NULL DO NOTHING
