"""`ratifier audit show CALL_ID` (filled in below)."""

from __future__ import annotations

from commands.catalog import Catalog
from schemas.settings import Settings


def show_call(
    settings: Settings, catalog: Catalog, call_id: str, *, tenant: str | None, as_json: bool
) -> int:
    raise NotImplementedError
