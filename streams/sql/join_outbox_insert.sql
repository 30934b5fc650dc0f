-- The approval-join: the records a batch's state changes publish, in that transaction.
INSERT INTO approval_outbox (deployment, call_id, topic, key, value, traceparent)
SELECT %(deployment)s, u.call_id, u.topic, u.key, u.value, u.traceparent
FROM unnest(%(call_ids)s::text[], %(topics)s::text[], %(keys)s::text[], %(values)b::bytea[],
            %(traceparents)b::bytea[]) WITH ORDINALITY AS u(call_id, topic, key, value, traceparent, n)
ORDER BY u.n
RETURNING id
