-- A group commit's transaction waits at most this long for a row lock held by another
-- transaction: the member is then rolled back to its savepoint and runs alone, instead of
-- holding the whole group (and, in a deadlock, waiting for PostgreSQL's deadlock_timeout).
SET LOCAL lock_timeout = '100ms'
