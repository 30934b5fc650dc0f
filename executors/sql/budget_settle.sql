-- An operation's outcome is known: its reservations are consumed (it succeeded) or released
-- (refused, failed). Only reserved ones move: a settlement is applied once.
UPDATE budget_usage
SET state = %(state)s, settled_at = now()
WHERE tenant = %(tenant)s AND operation_id = %(operation_id)s AND state = 'reserved'
RETURNING budget, amount
