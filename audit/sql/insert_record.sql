INSERT INTO audit_records (topic, kafka_partition, kafka_offset, prefix, stream, record_key,
                           call_id, tenant, tool, status, error_code, trace_id, record_at, record)
VALUES (%(topic)s, %(kafka_partition)s, %(kafka_offset)s, %(prefix)s, %(stream)s, %(record_key)s,
        %(call_id)s, %(tenant)s, %(tool)s, %(status)s, %(error_code)s, %(trace_id)s,
        %(record_at)s, %(record)s::jsonb)
ON CONFLICT (topic, kafka_partition, kafka_offset) DO NOTHING
