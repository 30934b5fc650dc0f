SELECT topic, kafka_partition, kafka_offset, stream, tenant, tool, status, error_code, trace_id,
       record_at, record
FROM audit_records
WHERE prefix = %(prefix)s AND call_id = %(call_id)s
  AND (%(tenant)s::text IS NULL OR tenant IS NULL OR tenant = %(tenant)s)
ORDER BY record_at, topic, kafka_partition, kafka_offset
