-- formerly: payments/0001_seed
-- Seed data for the reference domain: two tenants. Idempotent.

INSERT INTO payments (tenant, payment_id, customer_email, amount_minor, currency, refundable_minor, status)
VALUES
    ('tenant-a', 'pay_A1001', 'alice@example.com', 4900, 'EUR', 4900, 'captured'),
    ('tenant-a', 'pay_A1002', 'bob@example.com',  12000, 'EUR', 2000, 'captured'),
    ('tenant-b', 'pay_B2001', 'carol@example.org', 7500, 'USD', 7500, 'captured')
ON CONFLICT (tenant, payment_id) DO NOTHING;

INSERT INTO payment_methods (tenant, payment_method_id, customer_email, brand, last4)
VALUES
    ('tenant-a', 'pm_A1', 'alice@example.com', 'visa', '4242'),
    ('tenant-b', 'pm_B1', 'carol@example.org', 'mastercard', '4444')
ON CONFLICT (tenant, payment_method_id) DO NOTHING;

INSERT INTO refund_policies (tenant, max_days, auto_approve_max_minor, currency)
VALUES
    ('tenant-a', 30, 0, 'EUR'),
    ('tenant-b', 14, 0, 'USD')
ON CONFLICT (tenant) DO NOTHING;
