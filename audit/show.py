"""`ratifier audit show CALL_ID`: read a call's records from the audit store and print its
story (see `audit.story`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import psycopg

from audit.masking import Masker
from audit.story import Story, build_story, render
from commands.catalog import Catalog
from commands.sql import named_query
from config.settings import Settings
from runtime.clients import database_conninfo, pg_connect
from schemas.errors import StorageUnavailable

_PKG = "audit"


def load_story(
    settings: Settings, catalog: Catalog, call_id: str, *, tenant: str | None
) -> Story | None:
    """The call's story, or None when the audit store knows nothing of it (for ``tenant``)."""
    masker = Masker.for_catalog(catalog, salt=settings.audit_salt)
    params: dict[str, Any] = {
        "prefix": settings.topic_prefix,
        "call_id": call_id,
        "tenant": tenant,
    }
    try:
        with pg_connect(database_conninfo(settings), dict_rows=True) as conn:
            records = conn.execute(named_query(_PKG, "records_of_call"), params).fetchall()
            log = conn.execute(named_query(_PKG, "audit_log_of_call"), params).fetchall()
            operations = sorted(
                {
                    r["record"]["operation_id"]
                    for r in records
                    if isinstance(r["record"], dict)
                    and isinstance(r["record"].get("operation_id"), str)
                }
            )
            ledger = conn.execute(
                named_query(_PKG, "ledger_of_call"), {**params, "operation_ids": operations}
            ).fetchall()
    except psycopg.OperationalError as exc:
        raise StorageUnavailable("PostgreSQL is not reachable for the audit log.") from exc
    rows = [*records, *log, *ledger]
    if not rows or (tenant is not None and not any(r.get("tenant") == tenant for r in rows)):
        return None
    # Handler results kept by the ledger are shown masked like everything else.
    ledger = [
        {**row, "outcome": masker.mask(row["outcome"]), "effect": masker.mask(row["effect"])}
        for row in ledger
    ]
    return build_story(call_id, records=records, log=log, ledger=ledger)


def show_call(
    settings: Settings, catalog: Catalog, call_id: str, *, tenant: str | None, as_json: bool
) -> int:
    story = load_story(settings, catalog, call_id, tenant=tenant)
    if story is None:
        scope = f" in tenant {tenant}" if tenant else ""
        print(
            f"ratifier audit show: no audit records for call {call_id!r}{scope} under topic "
            f"prefix {settings.topic_prefix!r} (is `ratifier audit sink` running for it?)",
            file=sys.stderr,
        )
        return 1
    if as_json:
        print(json.dumps(story.as_json(), indent=2, ensure_ascii=False))
    else:
        print(render(story))
    return 0
