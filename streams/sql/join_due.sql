-- The approval-join's timer: call ids whose state is due (expiry, a hold's end, forgetting),
-- soonest first, from the due-time index; deployment-wide (every tenant's approvals expire).
SELECT call_id
FROM approval_states
WHERE deployment = %(deployment)s AND due_at <= %(now)s
ORDER BY due_at
LIMIT %(limit)s
