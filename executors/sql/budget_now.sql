-- The database's clock: every executor puts a reservation in the same window at the same
-- moment, whatever its own clock says.
SELECT statement_timestamp() AS now
