UPDATE refunds
SET status = 'failed', updated_at = now()
WHERE tenant = %(tenant)s AND operation_id = %(operation_id)s AND status = 'pending'
RETURNING payment_id, amount_minor
