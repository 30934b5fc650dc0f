-- The approval-join: take the records this worker just wrote, in a transaction held open
-- until the broker has acknowledged them (its commit deletes them; a crash leaves them).
-- Rows another worker took meanwhile (held or gone) are not returned. The deletion's commit
-- need not wait for the disk (synchronous_commit off for this transaction only): lost in a
-- crash of PostgreSQL, the rows are published again, as after a worker's death.
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
DELETE FROM approval_outbox
WHERE id IN (
    SELECT id FROM approval_outbox
    WHERE deployment = %(deployment)s AND id = ANY(%(ids)s::bigint[])
    FOR UPDATE SKIP LOCKED
)
AND EXISTS (SELECT 1 FROM relaxed)
RETURNING id
