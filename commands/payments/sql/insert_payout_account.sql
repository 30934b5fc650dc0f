INSERT INTO payout_accounts (tenant, payout_account_id, payment_id, operation_id, account_holder,
                             account_last4)
VALUES (%(tenant)s, %(payout_account_id)s, %(payment_id)s, %(operation_id)s, %(account_holder)s,
        %(account_last4)s)
