SELECT tenant, payment_method_id, brand, last4
FROM payment_methods
WHERE tenant = %(tenant)s AND payment_method_id = %(payment_method_id)s
