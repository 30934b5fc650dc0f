-- What counts in a window (reserved or consumed), for the operation about to reserve.
SELECT coalesce(sum(amount), 0)::bigint AS used,
       min(reserved_at) AS oldest,
       bool_or(operation_id = %(operation_id)s) AS ours
FROM budget_usage
WHERE tenant = %(tenant)s AND budget = %(budget)s AND scope_key = %(scope_key)s
  AND window_key = %(window_key)s AND reserved_at >= %(since)s AND state <> 'released'
