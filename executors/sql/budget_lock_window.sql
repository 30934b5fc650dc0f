-- Create the window's row or lock the existing one (ON CONFLICT DO UPDATE takes the row
-- lock): held until the commit, so the sum below and the insert after it are not raced.
INSERT INTO budget_windows (tenant, budget, scope_key, window_key)
VALUES (%(tenant)s, %(budget)s, %(scope_key)s, %(window_key)s)
ON CONFLICT (tenant, budget, scope_key, window_key) DO UPDATE SET locked_at = now()
RETURNING budget
