"""`ratifier check-call FILE.json`: dry-run one proposed call and print the decision with its
reasons. The file::

    {
      "tool": "propose_refund",                      # or "format" + "call" (openai, ...)
      "arguments": {"payment_id": "pay_A1001", "amount_minor": 500, "reason": "late"},
      "actor": {"tenant": "tenant-a", "sub": "agent-7", "roles": ["refund"]},
      "resource": {"kind": "payment", "id": "pay_A1001", "attributes": {...}}   # optional
    }

Without ``"resource"`` the tool's loader reads it from ``RATIFIER_STORAGE__DATABASE_URL``
(read-only, the actor's tenant in the WHERE); ``"resource": null`` means "not found".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from commands.catalog import Resource, load_catalog
from config.settings import Settings
from feeds.policies import local_policies
from ratifier.testing import Kit
from runtime.clients import database_conninfo, pg_connect_async
from schemas.envelopes import Actor, CallFormat, ProposedCall
from schemas.errors import ConfigurationError


def _read(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(body, dict) or not isinstance(body.get("actor"), dict):
        raise ConfigurationError(f"{path}: needs an object with 'actor' (tenant, sub, roles)")
    return body


async def check_call(settings: Settings, path: Path) -> Any:
    body = _read(path)
    kit = Kit(catalog=load_catalog(settings.catalog), policies=local_policies(settings))
    actor = Actor.model_validate(body["actor"])
    proposal = ProposedCall(
        call_id="check-call",
        tool=body.get("tool"),
        arguments=body.get("arguments"),
        context="offline",
        format=CallFormat(body.get("format", "native")),
        call=body.get("call"),
        proposed_at=datetime.now(UTC),
    )
    if "resource" in body:
        given = body["resource"]
        resource = (
            None if given is None else Resource.model_validate({"tenant": actor.tenant, **given})
        )
        return await kit._run(proposal, actor, resource=resource)
    async with await pg_connect_async(
        database_conninfo(settings), dict_rows=True, read_only=True
    ) as conn:
        return await kit._run(proposal, actor, conn=conn)
