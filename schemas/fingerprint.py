"""Canonical JSON and the approval/idempotency fingerprint defined by the contract."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept as is: the form every fingerprint hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(*, tenant: str, tool: str, arguments: dict[str, Any], policy_version: str) -> str:
    """SHA-256 (hex) of the canonical JSON of ``{tenant, tool, arguments, policy_version}``."""
    body = canonical_json(
        {"tenant": tenant, "tool": tool, "arguments": arguments, "policy_version": policy_version}
    )
    return hashlib.sha256(body.encode()).hexdigest()


def operation_id(tenant: str, idempotency_key: str) -> str:
    return f"{tenant}:{idempotency_key}"
