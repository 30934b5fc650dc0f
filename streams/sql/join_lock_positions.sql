-- The approval-join: lock the applied-offset row of each source partition of a batch (made
-- at its first use) and read how far its records were applied (approval_offsets). Rows are
-- locked in (topic, partition) order, so two workers never wait on each other in a circle.
-- Deployment-wide, not tenant data: a partition holds every tenant's records.
INSERT INTO approval_offsets AS o (deployment, topic, partition, next_offset)
SELECT %(deployment)s, u.topic, u.partition, 0
FROM unnest(%(topics)s::text[], %(partitions)s::integer[]) AS u(topic, partition)
ORDER BY u.topic, u.partition
ON CONFLICT (deployment, topic, partition) DO UPDATE SET next_offset = o.next_offset
RETURNING o.topic, o.partition, o.next_offset
