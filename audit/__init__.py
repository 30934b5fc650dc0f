"""The audit log: a Kafka → PostgreSQL sink of every pipeline record (secrets masked) and
`ratifier audit show`, a call's whole story. Imports `schemas` and `commands` only."""
