"""The Kafka key of a `calls.proposed` record (contract v1.6): a tenant's lane,
``"<tenant>#<lane>"`` with ``lane`` in ``0..PROPOSAL_LANES-1``, so that one tenant's calls land
on a small, tenant-specific subset of the topic's partitions (shuffle sharding) and a flood of
one tenant queues only in front of the calls that share its partitions (docs/operations.md,
"Fair admission"). The tenant is read from the context token's payload *without* verifying
it: the key routes, it never authorizes (the validator and authorizer verify the token
itself). A record keyed by its call id (contract up to v1.5) is still accepted everywhere.

Since v1.7 the validator keys a call's `calls.validated` record by the same lane when its
proposal came keyed by it (:func:`validated_key`), so that the authorizer reads one tenant's
admitted calls on that tenant's partitions too.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib

# Lanes per tenant: 2 of the default 12 partitions keep two given tenants apart with
# probability ≈ 0.68 (one lane shared at most otherwise), and give one tenant two
# partitions' worth of validators.
PROPOSAL_LANES = 2
LANE_SEPARATOR = "#"
_MAX_TENANT_CHARS = 128


def tenant_claim(context: str) -> str | None:
    """The ``tenant`` claim of a compact JWS context token, unverified (routing only); None
    when it cannot be read."""
    parts = context.split(".")
    if len(parts) != 3 or len(parts[1]) > 16_384:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return None
    tenant = payload.get("tenant") if isinstance(payload, dict) else None
    if not isinstance(tenant, str) or not tenant:
        return None
    return tenant[:_MAX_TENANT_CHARS]


def lane_of(call_id: str, lanes: int = PROPOSAL_LANES) -> int:
    """The lane of a call (a stable function of its id: a retried record keeps its key)."""
    return zlib.crc32(call_id.encode()) % max(1, lanes)


def proposal_key(context: str, *, call_id: str, lanes: int = PROPOSAL_LANES) -> str:
    """The Kafka key of a proposed call: its tenant's lane, or its call id when the token
    names no readable tenant (the authorizer refuses such a call anyway)."""
    tenant = tenant_claim(context)
    if tenant is None:
        return call_id
    return f"{tenant}{LANE_SEPARATOR}{lane_of(call_id, lanes)}"


def validated_key(key: str | None, *, call_id: str, context: str) -> str:
    """The Kafka key of a call's `calls.validated` record (v1.7): ``key``, its proposal's,
    when that is the lane :func:`proposal_key` gives the call; else its call id (a proposal
    keyed by call id, as up to v1.5, or by anything else)."""
    if key is None or key == call_id or LANE_SEPARATOR not in key:
        return call_id
    return key if key == proposal_key(context, call_id=call_id) else call_id
