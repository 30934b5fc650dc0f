DELETE FROM payment_methods
WHERE tenant = %(tenant)s AND payment_method_id = %(payment_method_id)s
