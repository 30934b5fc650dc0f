UPDATE payments
SET refundable_minor = refundable_minor + %(amount_minor)s
WHERE tenant = %(tenant)s AND payment_id = %(payment_id)s
