INSERT INTO refunds (tenant, refund_id, payment_id, operation_id, amount_minor, currency, reason, status)
VALUES (%(tenant)s, %(refund_id)s, %(payment_id)s, %(operation_id)s, %(amount_minor)s,
        %(currency)s, %(reason)s, 'pending')
