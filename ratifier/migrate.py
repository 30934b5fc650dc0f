"""Apply the plain-SQL migrations under ``deploy/migrations`` once each, in order."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

from commands.sql import named_query
from schemas.errors import StorageUnavailable

log = logging.getLogger("ratifier.migrate")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "migrations"
# Serializes concurrent `migrate` runs (up, executor and streams may start together).
ADVISORY_LOCK_ID = 0x5241544946  # "RATIF"

_PKG = "ratifier"


def migrate(database_url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations; return the versions applied now."""
    files = sorted(directory.glob("*.sql"))
    applied: list[str] = []
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            lock = {"lock_id": ADVISORY_LOCK_ID}
            conn.execute(named_query(_PKG, "advisory_lock"), lock)
            try:
                conn.execute(named_query(_PKG, "create_schema_migrations"))
                done = {row[0] for row in conn.execute(named_query(_PKG, "applied_migrations"))}
                for path in files:
                    version = path.stem
                    if version in done:
                        continue
                    with conn.transaction():
                        conn.execute(path.read_text(encoding="utf-8"))
                        conn.execute(named_query(_PKG, "record_migration"), {"version": version})
                    log.info("applied migration %s", version)
                    applied.append(version)
            finally:
                conn.execute(named_query(_PKG, "advisory_unlock"), lock)
    except psycopg.OperationalError as exc:
        raise StorageUnavailable("PostgreSQL is not reachable for migrations.") from exc
    return applied
