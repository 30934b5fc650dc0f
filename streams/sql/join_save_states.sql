-- The approval-join: the new states of a batch, one JSON array of
-- {call_id, tenant, phase, due_at, state, sources} (one parameter).
INSERT INTO approval_states AS s
    (deployment, call_id, tenant, phase, due_at, state, sources, updated_at)
SELECT %(deployment)s, a.call_id, a.tenant, a.phase, a.due_at, a.state,
       coalesce(a.sources, '{}'::jsonb), now()
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS a(call_id text, tenant text, phase text, due_at timestamptz, state jsonb, sources jsonb)
ON CONFLICT (deployment, call_id) DO UPDATE
SET tenant = EXCLUDED.tenant, phase = EXCLUDED.phase, due_at = EXCLUDED.due_at,
    state = EXCLUDED.state, sources = EXCLUDED.sources, updated_at = now()
