"""Call binding's per-call proof (RFC 7800 `cnf` + a DPoP-style JWS), signed by the agent
runtime with the key its context token names; the validator checks it with the same claims."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import jwt

from schemas.fingerprint import canonical_json

CALL_PROOF_TYPE = "ratifier-call+jws"
PROOF_ALGORITHMS = frozenset({"EdDSA", "ES256"})
PROOF_JWS = jwt.PyJWS(algorithms=sorted(PROOF_ALGORITHMS))


def _sha256_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def call_proof_claims(
    *, call_id: str, idempotency_key: str, tool: str, arguments: Any, context: str
) -> dict[str, str]:
    """What a call proof signs: the call's identity and content, and the token it is made
    with (``ath``), so that neither the token nor the proof can be moved to another call."""
    return {
        "call_id": call_id,
        "idempotency_key": idempotency_key,
        "tool": tool,
        "arguments_sha256": _sha256_b64(canonical_json(arguments).encode()),
        "ath": _sha256_b64(context.encode()),
    }


def sign_call_proof(
    private_key: Any,
    *,
    call_id: str,
    idempotency_key: str,
    tool: str,
    arguments: Any,
    context: str,
    algorithm: str = "EdDSA",
    now: float | None = None,
) -> str:
    """The agent runtime's proof for one call, signed with the key its token names in
    ``cnf``. ``arguments`` are the normalized arguments (what the validator passes on)."""
    claims: dict[str, Any] = call_proof_claims(
        call_id=call_id,
        idempotency_key=idempotency_key,
        tool=tool,
        arguments=arguments,
        context=context,
    )
    claims["iat"] = int(time.time() if now is None else now)
    return PROOF_JWS.encode(
        canonical_json(claims).encode(),
        private_key,
        algorithm=algorithm,
        headers={"typ": CALL_PROOF_TYPE},
    )
