SELECT tenant, refund_id, payment_id, amount_minor, currency, reason, status, provider_ref
FROM refunds
WHERE tenant = %(tenant)s AND refund_id = ANY(%(refund_ids)s)
