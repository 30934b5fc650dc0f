SELECT tenant, payment_id, customer_email, amount_minor, currency, refundable_minor, status
FROM payments
WHERE tenant = %(tenant)s AND payment_id = ANY(%(payment_ids)s)
