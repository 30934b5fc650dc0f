SELECT r.call_id AS request_call_id, r.fingerprint AS request_fingerprint,
       r.outcome AS request_outcome,
       l.call_id AS ledger_call_id, l.fingerprint AS ledger_fingerprint,
       l.status AS ledger_status, l.outcome AS ledger_outcome
FROM (SELECT %(tenant)s::text AS tenant, %(idempotency_key)s::text AS idempotency_key) AS k
LEFT JOIN approval_requests r
  ON r.tenant = k.tenant AND r.idempotency_key = k.idempotency_key
LEFT JOIN command_ledger l
  ON l.tenant = k.tenant AND l.idempotency_key = k.idempotency_key
WHERE k.tenant = %(tenant)s AND k.idempotency_key = %(idempotency_key)s
