"""Workers never migrate: they check the schema version and refuse a database behind them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from ratifier.migrate import MIGRATIONS_DIR, migrate, pending_migrations, require_current_schema
from schemas.errors import ConfigurationError
from tests.services import TEST_DATABASE_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database of its own, created empty and dropped afterwards."""
    name = f"ratifier_schema_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(TEST_DATABASE_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(TEST_DATABASE_URL)
    yield urlunsplit(parts._replace(path=f"/{name}"))
    with psycopg.connect(TEST_DATABASE_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_worker_refuses_a_database_behind_its_build_and_starts_after_migrate(
    empty_database: str,
) -> None:
    ours = sorted(path.stem for path in MIGRATIONS_DIR.glob("*.sql"))
    # the reference catalog's own, after ours
    every = [*ours, "payments/0001_tables", "payments/0002_seed", "payments/0003_payout_accounts"]
    assert pending_migrations(empty_database) == every
    with pytest.raises(ConfigurationError, match="ratifier migrate"):
        require_current_schema(empty_database)
    # The real command: it exits with a clear message instead of migrating by itself.
    refused = subprocess.run(
        [sys.executable, "-m", "ratifier.cli", "reconciler"],
        env={**os.environ, "RATIFIER_STORAGE__DATABASE_URL": empty_database},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "schema is behind this build" in refused.stderr
    assert every[-1] in refused.stderr
    assert pending_migrations(empty_database) == every  # nothing was applied by the worker
    assert migrate(empty_database) == every
    require_current_schema(empty_database)
    assert pending_migrations(empty_database) == []


def test_a_database_migrated_before_the_domain_moved_applies_nothing_again(
    empty_database: str,
) -> None:
    """The reference domain's tables were part of our 0001_schema and 0007_payout_accounts,
    and its seed was `payments/0001_seed`: a database that recorded those versions has
    nothing pending after the move (each moved file names its former version)."""
    migrate(empty_database)
    formerly = {
        "payments/0001_tables": "0001_schema",
        "payments/0002_seed": "payments/0001_seed",
        "payments/0003_payout_accounts": "0007_payout_accounts",
    }
    with psycopg.connect(empty_database, autocommit=True) as conn:
        for moved in formerly:
            conn.execute("DELETE FROM schema_migrations WHERE version = %s", (moved,))
        conn.execute(
            "INSERT INTO schema_migrations (version) VALUES ('0007_payout_accounts'), "
            "('payments/0001_seed') ON CONFLICT DO NOTHING"
        )
        before = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
    assert before >= set(formerly.values())
    assert pending_migrations(empty_database) == []
    assert migrate(empty_database) == []
    with psycopg.connect(empty_database) as conn:
        after = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
    assert after == before
