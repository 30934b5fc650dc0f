-- The approval-join: take the records this worker just wrote, in a transaction held open
-- until the broker has acknowledged them (its commit deletes them; a crash leaves them).
-- Rows another worker took meanwhile (held or gone) are not returned.
DELETE FROM approval_outbox
WHERE id IN (
    SELECT id FROM approval_outbox
    WHERE deployment = %(deployment)s AND id = ANY(%(ids)s::bigint[])
    FOR UPDATE SKIP LOCKED
)
RETURNING id
