-- Many calls' audit rows of one kind in one statement (one round trip, one parse).
INSERT INTO audit_log (tenant, call_id, kind, detail)
SELECT a.tenant, a.call_id, %(kind)s, a.detail
FROM unnest(%(tenants)s::text[], %(call_ids)s::text[], %(details)s::jsonb[])
     AS a(tenant, call_id, detail)
