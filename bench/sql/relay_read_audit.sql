INSERT INTO bench_relay_reads (call_key, payment_id)
SELECT * FROM unnest(%(call_keys)s::text[], %(payment_ids)s::text[])
