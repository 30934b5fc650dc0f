-- The approval-join: records written by a worker that did not publish them (it died, or its
-- transaction to publish them failed), oldest first; those a live worker holds are skipped.
-- Taken in a transaction held open until the broker has acknowledged them (its commit need
-- not wait for the disk, as in join_outbox_take).
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
DELETE FROM approval_outbox
WHERE id IN (
    SELECT id FROM approval_outbox
    WHERE deployment = %(deployment)s AND created_at < now() - make_interval(secs => %(age)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
AND EXISTS (SELECT 1 FROM relaxed)
RETURNING id, call_id, topic, key, value, traceparent
