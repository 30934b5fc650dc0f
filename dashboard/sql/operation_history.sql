-- What happened to these operations, oldest first: the audit log of the executor, the
-- reconciler and humans (tenant and call id pairs, in the same order).
SELECT h.tenant, h.call_id, h.at, h.kind, h.detail
FROM audit_log h
JOIN unnest(%(tenants)s::text[], %(call_ids)s::text[]) AS wanted (tenant, call_id)
  ON h.tenant = wanted.tenant AND h.call_id = wanted.call_id
ORDER BY h.id
