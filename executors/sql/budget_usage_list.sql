-- `ratifier budgets`: a budget's windows with what counts in them, per tenant and scope.
SELECT tenant, scope_key,
       coalesce(sum(amount) FILTER (WHERE state = 'consumed'), 0)::bigint AS consumed,
       coalesce(sum(amount) FILTER (WHERE state = 'reserved'), 0)::bigint AS reserved,
       min(reserved_at) AS oldest
FROM budget_usage
WHERE tenant = %(tenant)s
  AND budget = %(budget)s AND window_key = %(window_key)s AND reserved_at >= %(since)s
  AND state <> 'released'
GROUP BY tenant, scope_key
ORDER BY tenant, scope_key
