-- The approval-join keeps no secret argument at rest (docs/approvals.md, "Durability"): the
-- calls of a state are stored with their secret fields masked, and, for each such call,
-- where its record with the arguments is on Kafka (its `calls.authorized` record, or the
-- faust join's changelog record for a state migrated from it), to read them back when the
-- join needs them: {"<call id>": {"topic", "partition", "offset", "kind": "call"|"state"}}.
ALTER TABLE approval_states ADD COLUMN IF NOT EXISTS sources jsonb NOT NULL DEFAULT '{}'::jsonb;
