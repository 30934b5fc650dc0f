from __future__ import annotations

import base64
import json
import time

import jwt
import pytest

from schemas.errors import Unauthenticated
from schemas.identity import ContextKeys, issue_context_token, verify_context_token
from tests.unit.conftest import KEYS, token


def test_round_trip_gives_actor_from_token_only() -> None:
    actor = verify_context_token(token(roles=("support", "refund")), KEYS)
    assert (actor.tenant, actor.sub, actor.roles) == ("tenant-a", "agent-1", ("support", "refund"))


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(**overrides: object) -> dict[str, object]:
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": "u",
        "tenant": "tenant-a",
        "roles": [],
        "aud": "ratifier",
        "iss": "ratifier-local",
        "iat": now,
        "nbf": now,
        "exp": now + 60,
    }
    claims.update(overrides)
    return claims


@pytest.mark.parametrize(
    "bad",
    [
        jwt.encode(_claims(exp=int(time.time()) - 3600), KEYS.secret, algorithm="HS256"),
        jwt.encode(_claims(nbf=int(time.time()) + 3600), KEYS.secret, algorithm="HS256"),
        jwt.encode(_claims(aud="someone-else"), KEYS.secret, algorithm="HS256"),
        jwt.encode(_claims(iss="evil"), KEYS.secret, algorithm="HS256"),
        jwt.encode(_claims(), "another-secret-that-is-also-long-enough", algorithm="HS256"),
        jwt.encode(_claims(tenant="bad tenant!"), KEYS.secret, algorithm="HS256"),
        jwt.encode(
            {k: v for k, v in _claims().items() if k != "tenant"}, KEYS.secret, algorithm="HS256"
        ),
        _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(_claims()) + ".",
        "not-a-token",
    ],
    ids=[
        "expired",
        "not-yet-valid",
        "audience",
        "issuer",
        "signature",
        "tenant-shape",
        "no-tenant",
        "alg-none",
        "garbage",
    ],
)
def test_bad_tokens_are_unauthenticated(bad: str) -> None:
    with pytest.raises(Unauthenticated):
        verify_context_token(bad, KEYS)


def test_unconfigured_algorithm_is_refused() -> None:
    keys = ContextKeys(
        secret=KEYS.secret, audience="ratifier", issuer="ratifier-local", algorithms=("HS512",)
    )
    with pytest.raises(Unauthenticated):
        verify_context_token(issue_context_token(KEYS, sub="u", tenant="tenant-a"), keys)
