-- The authorizer's early view of budgets (docs/budgets.md, "Budgets in Cedar policies"):
-- what counts (reserved or consumed) in each asked window of one scope, for a whole batch
-- at once. One index range scan (budget_usage_window) per distinct window asked.
SELECT u.tenant, u.budget, u.scope_key, u.window_key,
       coalesce(sum(u.amount), 0)::bigint AS used,
       coalesce(sum(u.amount) FILTER (WHERE u.state = 'reserved'), 0)::bigint AS reserved
FROM unnest(%(tenants)s::text[], %(budgets)s::text[], %(scope_keys)s::text[],
            %(window_keys)s::text[], %(since)s::timestamptz[])
     AS w(tenant, budget, scope_key, window_key, since)
JOIN budget_usage u
  ON u.tenant = w.tenant AND u.budget = w.budget AND u.scope_key = w.scope_key
 AND u.window_key = w.window_key AND u.reserved_at >= w.since
WHERE u.tenant = ANY(%(tenants)s::text[]) AND u.state <> 'released'
GROUP BY u.tenant, u.budget, u.scope_key, u.window_key
