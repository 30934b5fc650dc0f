-- `ratifier migrate-approvals` (upgrade from the faust join): a state read from the
-- former changelog topic, unless the join already has one for that call (never overwritten).
INSERT INTO approval_states (deployment, call_id, tenant, phase, due_at, state, sources)
VALUES (%(deployment)s, %(call_id)s, %(tenant)s, %(phase)s, %(due_at)s, %(state)s, %(sources)s)
ON CONFLICT (deployment, call_id) DO NOTHING
RETURNING call_id
