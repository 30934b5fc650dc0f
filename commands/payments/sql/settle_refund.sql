UPDATE refunds
SET status = 'succeeded', provider_ref = %(provider_ref)s, updated_at = now()
WHERE tenant = %(tenant)s AND operation_id = %(operation_id)s AND status = 'pending'
