-- v1.3 reply routing: a call answered `unknown` keeps its reply address, so that the settled
-- outcome reconciliation owes it is copied to that call's reply topic too (not only to the
-- reply topic of the call that started the operation).
ALTER TABLE unknown_calls ADD COLUMN IF NOT EXISTS reply_to jsonb;
