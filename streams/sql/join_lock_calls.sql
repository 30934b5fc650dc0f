-- The approval-join: one transaction at a time per call id (a call's records of both topics,
-- and its timer, may be handled by different workers). Transaction-scoped advisory locks on
-- keys the worker derives from (deployment, call id), passed sorted: every transaction takes
-- them in the same order.
SELECT pg_advisory_xact_lock(k) FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, n)
ORDER BY u.n
