-- The approval-join's state in PostgreSQL (issue 44; before, a faust table with a changelog
-- topic). Everything is per deployment: its topic prefix, as the consumer groups are, so that
-- deployments sharing a database (the tests do) never touch each other's approvals.
--
-- One row per call id the join remembers (streams/approval.py's ApprovalState, as JSON):
-- pending (waiting for a human), held (decisions that came before their request), or
-- terminal (committed, rejected, expired, denied; kept until `forget_at` so that a replayed
-- decision is still recognised as used). `due_at` is when the timer acts on it next (expiry,
-- a hold's end, forgetting): expiry is a query on that index, never a scan.
CREATE TABLE IF NOT EXISTS approval_states (
    deployment  text        NOT NULL,
    call_id     text        NOT NULL,
    tenant      text,
    phase       text        NOT NULL
                CHECK (phase IN ('pending', 'held', 'committed', 'rejected', 'expired', 'denied')),
    due_at      timestamptz,
    state       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment, call_id)
);
CREATE INDEX IF NOT EXISTS approval_states_due
    ON approval_states (deployment, due_at) WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS approval_states_pending
    ON approval_states (deployment, tenant) WHERE phase = 'pending';

-- The next offset of each source partition (calls.authorized, approvals.decided) whose
-- records the join has applied, written in the same transaction as their state changes:
-- a record redelivered after a crash (its Kafka offset not committed yet) or handed to a new
-- owner by a rebalance is recognised and changes nothing. Locking a partition's row also
-- serializes two workers that both hold it for a moment during a rebalance.
CREATE TABLE IF NOT EXISTS approval_offsets (
    deployment  text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (deployment, topic, partition)
);

-- The join's outbox: every record a state change publishes (approvals.requested,
-- commands.committed, outcomes, dead letters), written in the state change's transaction.
-- The worker that wrote them takes them at once (deleted in a transaction held open until the
-- broker has acknowledged them, then committed: a worker that dies meanwhile leaves them
-- here); rows left by a worker that died are taken by any worker of the deployment. `value`
-- holds the record's exact bytes, `traceparent` the join's hop that produced it.
CREATE TABLE IF NOT EXISTS approval_outbox (
    id           bigserial   PRIMARY KEY,
    deployment   text        NOT NULL,
    call_id      text,
    topic        text        NOT NULL,
    key          text,
    value        bytea       NOT NULL,
    traceparent  bytea,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS approval_outbox_deployment ON approval_outbox (deployment, id);
