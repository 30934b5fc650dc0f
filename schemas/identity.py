"""Signed actor context: the only source of tenant, user and roles.

A context is a compact JWS (JWT) issued by the trusted agent runtime. Verification checks
signature, algorithm, ``exp``, ``nbf``, ``iat``, ``aud`` and ``iss`` with a small clock skew.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from schemas.envelopes import Actor
from schemas.errors import Unauthenticated
from schemas.settings import Settings

LOCAL_ALGORITHM = "HS256"
REQUIRED_CLAIMS = ("sub", "tenant", "exp", "iat", "aud", "iss")


@dataclass(frozen=True, kw_only=True)
class ContextKeys:
    """Keys and expectations for verifying context tokens."""

    secret: str
    audience: str
    issuer: str
    leeway_seconds: int = 30
    algorithms: tuple[str, ...] = (LOCAL_ALGORITHM,)


def issue_context_token(
    keys: ContextKeys,
    *,
    sub: str,
    tenant: str,
    roles: tuple[str, ...] = (),
    sid: str | None = None,
    ttl_seconds: int = 3600,
    now: float | None = None,
) -> str:
    """Issue a local HS256 context token (demos, tests, local agents)."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, object] = {
        "sub": sub,
        "tenant": tenant,
        "roles": list(roles),
        "aud": keys.audience,
        "iss": keys.issuer,
        "iat": issued,
        "nbf": issued,
        "exp": issued + ttl_seconds,
    }
    if sid is not None:
        claims["sid"] = sid
    return jwt.encode(claims, keys.secret, algorithm=LOCAL_ALGORITHM)


def verify_context_token(token: str, keys: ContextKeys) -> Actor:
    """Verify ``token`` and return the actor it names, or raise `Unauthenticated`."""
    try:
        claims = jwt.decode(
            token,
            keys.secret,
            algorithms=list(keys.algorithms),
            audience=keys.audience,
            issuer=keys.issuer,
            leeway=keys.leeway_seconds,
            options={"require": list(REQUIRED_CLAIMS)},
        )
    except jwt.PyJWTError as exc:
        raise Unauthenticated() from exc
    roles = claims.get("roles", [])
    sid = claims.get("sid")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise Unauthenticated()
    try:
        return Actor(
            sub=str(claims["sub"]),
            tenant=str(claims["tenant"]),
            roles=tuple(roles),
            sid=sid if isinstance(sid, str) else None,
        )
    except ValueError as exc:
        raise Unauthenticated() from exc


def context_keys(settings: Settings) -> ContextKeys:
    return ContextKeys(
        secret=settings.context_secret,
        audience=settings.context_audience,
        issuer=settings.context_issuer,
        leeway_seconds=settings.clock_skew_seconds,
    )
