-- The budgets panel (docs/dashboard.md): each asked budget's current window, per scope of
-- the signed-in tenant, with what counts in it (consumed, and reserved for unsettled calls).
SELECT u.budget, u.scope_key,
       coalesce(sum(u.amount) FILTER (WHERE u.state = 'consumed'), 0)::bigint AS consumed,
       coalesce(sum(u.amount) FILTER (WHERE u.state = 'reserved'), 0)::bigint AS reserved,
       min(u.reserved_at) AS oldest
FROM unnest(%(budgets)s::text[], %(window_keys)s::text[], %(since)s::timestamptz[])
     AS w(budget, window_key, since)
JOIN budget_usage u
  ON u.budget = w.budget AND u.window_key = w.window_key AND u.reserved_at >= w.since
WHERE u.tenant = %(tenant)s AND u.state <> 'released'
GROUP BY u.budget, u.scope_key
ORDER BY u.budget, u.scope_key
LIMIT %(limit)s
