SELECT tenant, max_days, auto_approve_max_minor, currency
FROM refund_policies
WHERE tenant = %(tenant)s
