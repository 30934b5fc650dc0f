-- The audit sink's table: one row per Kafka record of every pipeline topic, written by
-- `ratifier audit sink`, idempotent on (topic, partition, offset), append-only.
CREATE TABLE IF NOT EXISTS audit_records (
    topic            text        NOT NULL,  -- full Kafka topic name, prefix included
    kafka_partition  integer     NOT NULL,
    kafka_offset     bigint      NOT NULL,
    prefix           text        NOT NULL,  -- the deployment's topic prefix, e.g. 'ratifier.'
    stream           text        NOT NULL,  -- logical topic = schemas.names.Topic value,
                                            -- e.g. 'calls.proposed', 'outcomes',
                                            -- 'approvals.requested', 'approvals.decided'
    record_key       text,
    call_id          text,
    tenant           text,                  -- when the record carries it (outcomes do)
    tool             text,
    status           text,                  -- outcomes: Outcome.status
    error_code       text,                  -- outcomes / dead letters: error code
    trace_id         text,
    record_at        timestamptz NOT NULL,  -- the Kafka record timestamp
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    record           jsonb       NOT NULL,  -- the record, secret fields masked (salted hash);
                                            -- unparseable input: {"unparseable": true,
                                            -- "sha256": "...", "bytes": N}
    PRIMARY KEY (topic, kafka_partition, kafka_offset)
);
CREATE INDEX IF NOT EXISTS audit_records_call ON audit_records (call_id, record_at);
CREATE INDEX IF NOT EXISTS audit_records_stream ON audit_records (prefix, stream, record_at DESC);

CREATE OR REPLACE FUNCTION audit_records_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_records is append-only';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS audit_records_no_change ON audit_records;
CREATE TRIGGER audit_records_no_change BEFORE UPDATE OR DELETE ON audit_records
    FOR EACH ROW EXECUTE FUNCTION audit_records_append_only();

DROP TRIGGER IF EXISTS audit_records_no_truncate ON audit_records;
CREATE TRIGGER audit_records_no_truncate BEFORE TRUNCATE ON audit_records
    FOR EACH STATEMENT EXECUTE FUNCTION audit_records_append_only();
