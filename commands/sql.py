"""Named SQL files, read once: SQL lives next to the code that runs it, never in f-strings."""

from __future__ import annotations

from functools import cache
from importlib import resources

from psycopg import sql


@cache
def named_query(package: str, name: str) -> sql.SQL:
    """The statement in ``<package>/sql/<name>.sql``."""
    text = resources.files(package).joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")
    return sql.SQL(text)
