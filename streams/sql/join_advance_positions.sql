-- The approval-join: the records of a batch are applied, in the transaction that applied
-- them (rows locked by join_lock_positions).
UPDATE approval_offsets AS o
SET next_offset = greatest(o.next_offset, u.next_offset)
FROM unnest(%(topics)s::text[], %(partitions)s::integer[], %(next_offsets)s::bigint[])
     AS u(topic, partition, next_offset)
WHERE o.deployment = %(deployment)s AND o.topic = u.topic AND o.partition = u.partition
