-- The approval-join: states whose time is up (streams/approval.py, on_tick), deleted.
DELETE FROM approval_states
WHERE deployment = %(deployment)s AND call_id = ANY(%(call_ids)s::text[])
