-- The approval-join: the states of a batch's call ids (locked by join_lock_calls), with
-- where the records of their calls' secret arguments are. Keyed by call id as the records
-- are (the Kafka key): a decision naming another tenant than its call must find the call's
-- state to be refused as such (streams/approval.py, `tenant_mismatch`), so the tenant is
-- checked by the join's decision, not in this WHERE.
SELECT call_id, state, sources
FROM approval_states
WHERE deployment = %(deployment)s AND call_id = ANY(%(call_ids)s::text[])
