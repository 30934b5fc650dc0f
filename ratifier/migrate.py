"""Apply the plain-SQL migrations under ``deploy/migrations`` once each, in order, then the
catalog's own (``Catalog(name=..., migrations=<folder>)``), recorded as ``<name>/<file>``:
a plugin numbers its migrations in its own folder, and the reference domain's tables and seed
data are applied only with the reference catalog.

A file that was recorded under another version before it moved or was renamed says so on its
first line, ``-- formerly: <version>``: a database that applied it under that version does not
apply it again (the reference domain's tables were part of our ``0001_schema`` once)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import psycopg

from commands.catalog import Catalog, load_catalog
from commands.sql import named_query
from runtime.clients import pg_connect
from schemas.errors import ConfigurationError, StorageUnavailable

log = logging.getLogger("ratifier.migrate")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "migrations"
# Serializes concurrent `migrate` runs (up, executor and streams may start together).
ADVISORY_LOCK_ID = 0x5241544946  # "RATIF"

_PKG = "ratifier"
_FORMERLY = re.compile(r"--\s*formerly:\s*(\S+)")


def _pending_files(directory: Path, catalog: Catalog | None) -> list[tuple[str, Path]]:
    files = [(path.stem, path) for path in sorted(directory.glob("*.sql"))]
    if catalog is not None and catalog.migrations is not None:
        files += [
            (f"{catalog.name}/{path.stem}", path)
            for path in sorted(catalog.migrations.glob("*.sql"))
        ]
    return files


def former_version(path: Path) -> str | None:
    """The version ``path`` was recorded under before it moved (its ``-- formerly:`` line)."""
    with path.open(encoding="utf-8") as text:
        found = _FORMERLY.match(text.readline().strip())
    return found.group(1) if found else None


def _applied(version: str, path: Path, done: set[str]) -> bool:
    return version in done or former_version(path) in done


def migrate(
    database_url: str, directory: Path = MIGRATIONS_DIR, catalog: Catalog | str | None = None
) -> list[str]:
    """Apply pending migrations (ours, then ``catalog``'s: by default the one
    ``RATIFIER_CATALOG`` names); return the versions applied now."""
    files = _pending_files(directory, _catalog(catalog))
    applied: list[str] = []
    try:
        with pg_connect(database_url, autocommit=True) as conn:
            lock = {"lock_id": ADVISORY_LOCK_ID}
            conn.execute(named_query(_PKG, "advisory_lock"), lock)
            try:
                conn.execute(named_query(_PKG, "create_schema_migrations"))
                done = {row[0] for row in conn.execute(named_query(_PKG, "applied_migrations"))}
                for version, path in files:
                    if _applied(version, path, done):
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


def _catalog(catalog: Catalog | str | None) -> Catalog:
    if catalog is None:
        from config.settings import Settings  # noqa: PLC0415 - only when not given

        catalog = Settings().catalog
    return load_catalog(catalog) if isinstance(catalog, str) else catalog


def pending_migrations(
    database_url: str, directory: Path = MIGRATIONS_DIR, catalog: Catalog | str | None = None
) -> list[str]:
    """The migrations (ours, then the catalog's) that the database has not applied yet."""
    files = _pending_files(directory, _catalog(catalog))
    try:
        with pg_connect(database_url, autocommit=True) as conn:
            present = conn.execute(named_query(_PKG, "schema_migrations_present")).fetchone()
            if present is None or not present[0]:
                return [version for version, _path in files]
            done = {row[0] for row in conn.execute(named_query(_PKG, "applied_migrations"))}
    except psycopg.OperationalError as exc:
        raise StorageUnavailable("PostgreSQL is not reachable to check its schema.") from exc
    known = {version for version, _path in files} | {former_version(p) for _v, p in files}
    ahead = sorted(version for version in done - known if "/" not in version)
    if ahead:
        # A newer build migrated first (rolling upgrade): migrations only add, so this one
        # keeps working, but say so.
        log.warning("the database has migrations this build does not know: %s", ahead)
    return [version for version, path in files if not _applied(version, path, done)]


def require_current_schema(
    database_url: str, directory: Path = MIGRATIONS_DIR, catalog: Catalog | str | None = None
) -> None:
    """Refuse to start a worker on a database whose schema is behind this build (or behind
    its catalog's migrations): workers never migrate (`ratifier migrate`, `make up` and the
    demo do, once)."""
    pending = pending_migrations(database_url, directory, catalog)
    if pending:
        raise ConfigurationError(
            f"the database schema is behind this build: {len(pending)} migration(s) not "
            f"applied ({', '.join(pending)}); run `ratifier migrate` first"
        )
