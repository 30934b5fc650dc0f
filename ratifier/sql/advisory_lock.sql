SELECT pg_advisory_lock(%(lock_id)s)
