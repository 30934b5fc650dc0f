SELECT pg_advisory_unlock(%(lock_id)s)
