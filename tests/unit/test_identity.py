from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import jwt.algorithms
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from runtime.identity import (
    ContextKeys,
    RefusedTokens,
    VerifiedTokens,
    issue_context_token,
    load_jwks,
    verify_context_token,
)
from schemas.errors import ConfigurationError, Unauthenticated
from tests.unit.conftest import KEYS, token

SECRET = KEYS.secret or ""


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
        jwt.encode(_claims(exp=int(time.time()) - 3600), SECRET, algorithm="HS256"),
        jwt.encode(_claims(nbf=int(time.time()) + 3600), SECRET, algorithm="HS256"),
        jwt.encode(_claims(aud="someone-else"), SECRET, algorithm="HS256"),
        jwt.encode(_claims(iss="evil"), SECRET, algorithm="HS256"),
        jwt.encode(_claims(), "another-secret-that-is-also-long-enough", algorithm="HS256"),
        jwt.encode(_claims(tenant="bad tenant!"), SECRET, algorithm="HS256"),
        jwt.encode(
            {k: v for k, v in _claims().items() if k != "tenant"}, SECRET, algorithm="HS256"
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


def test_hs256_disabled_refuses_local_tokens(tmp_path: Path) -> None:
    keys = jwks_keys(tmp_path, secret=None)
    with pytest.raises(Unauthenticated):
        verify_context_token(issue_context_token(KEYS, sub="u", tenant="tenant-a"), keys)


def _ed25519() -> tuple[Any, dict[str, Any]]:
    private = ed25519.Ed25519PrivateKey.generate()
    public_jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(private.public_key()))
    return private, public_jwk


def _rsa() -> tuple[Any, dict[str, Any]]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    return private, public_jwk


ED_OLD, ED_OLD_JWK = _ed25519()
ED_NEW, ED_NEW_JWK = _ed25519()
ED_RETIRED, _ = _ed25519()
RSA_KEY, RSA_JWK = _rsa()


def jwks_keys(tmp_path: Path, secret: str | None = KEYS.secret) -> ContextKeys:
    path = tmp_path / "jwks.json"
    path.write_text(
        json.dumps(
            {
                "keys": [
                    {**ED_OLD_JWK, "kid": "ed-2025", "alg": "EdDSA"},
                    {**ED_NEW_JWK, "kid": "ed-2026", "alg": "EdDSA"},
                    {**RSA_JWK, "kid": "rsa-1", "alg": "RS256"},
                ]
            }
        )
    )
    return ContextKeys(
        secret=secret, audience="ratifier", issuer="ratifier-local", public_keys=load_jwks(path)
    )


def signed(keys: ContextKeys, key: Any, kid: str, alg: str = "EdDSA") -> str:
    return issue_context_token(
        keys, sub="u", tenant="tenant-b", signing_key=key, kid=kid, algorithm=alg
    )


def test_asymmetric_keys_by_kid_during_rotation(tmp_path: Path) -> None:
    keys = jwks_keys(tmp_path)
    assert keys.algorithms == {"HS256", "EdDSA", "RS256"}
    for key, kid, alg in (
        (ED_OLD, "ed-2025", "EdDSA"),
        (ED_NEW, "ed-2026", "EdDSA"),
        (RSA_KEY, "rsa-1", "RS256"),
    ):
        assert verify_context_token(signed(keys, key, kid, alg), keys).tenant == "tenant-b"


@pytest.mark.parametrize(
    ("key", "kid", "alg"),
    [
        (ED_RETIRED, "ed-2024", "EdDSA"),  # rotated out: kid no longer published
        (ED_RETIRED, "ed-2026", "EdDSA"),  # right kid, wrong key: bad signature
        (RSA_KEY, "ed-2026", "RS256"),  # algorithm does not match the kid's key
    ],
    ids=["unknown-kid", "wrong-key", "alg-mismatch"],
)
def test_bad_asymmetric_tokens(tmp_path: Path, key: Any, kid: str, alg: str) -> None:
    keys = jwks_keys(tmp_path)
    with pytest.raises(Unauthenticated):
        verify_context_token(signed(keys, key, kid, alg), keys)


def test_issued_in_the_future_is_refused() -> None:
    future = time.time() + 3600
    token = issue_context_token(KEYS, sub="u", tenant="tenant-a", now=future)
    with pytest.raises(Unauthenticated):
        verify_context_token(token, KEYS)


def test_replay_mode_accepts_expired_but_still_checks_signature() -> None:
    old = issue_context_token(KEYS, sub="u", tenant="tenant-a", now=time.time() - 86400)
    assert verify_context_token(old, KEYS, check_expiry=False).tenant == "tenant-a"
    forged = jwt.encode(
        _claims(exp=1), "another-secret-that-is-also-long-enough", algorithm="HS256"
    )
    with pytest.raises(Unauthenticated):
        verify_context_token(forged, KEYS, check_expiry=False)


def test_jwks_with_private_key_or_no_alg_is_refused(tmp_path: Path) -> None:
    private_jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(ED_NEW))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"keys": [{**private_jwk, "kid": "x", "alg": "EdDSA"}]}))
    with pytest.raises(ConfigurationError, match="private"):
        load_jwks(path)
    path.write_text(json.dumps({"keys": [{**ED_NEW_JWK, "kid": "x"}]}))
    with pytest.raises(ConfigurationError, match="alg"):
        load_jwks(path)


def test_verified_token_is_answered_from_the_cache_until_it_expires() -> None:
    now = [1_000_000.0]
    keys = ContextKeys(
        secret=SECRET,
        audience=KEYS.audience,
        issuer=KEYS.issuer,
        leeway_seconds=0,
        verified=VerifiedTokens(max_entries=2, clock=lambda: now[0]),
    )
    issued = issue_context_token(keys, sub="u", tenant="tenant-a", ttl_seconds=60)
    expires = jwt.decode(issued, options={"verify_signature": False})["exp"]
    actor = verify_context_token(issued, keys)
    assert len(keys.verified) == 1
    # A hit does not verify again: the cached actor is the same object.
    now[0] = expires - 1
    assert verify_context_token(issued, keys) is actor
    # At expiry the entry goes, and the token is checked in full (PyJWT refuses it).
    now[0] = expires
    assert keys.verified.get(issued, keys.leeway_seconds) is None
    assert len(keys.verified) == 0


def test_token_cache_is_bounded_and_keeps_no_refusals() -> None:
    cache = VerifiedTokens(max_entries=2)
    actor = verify_context_token(token(), KEYS)
    for name in ("a", "b", "c"):
        cache.put(name, actor, time.time() + 60)
    assert len(cache) == 2 and cache.get("a", 0) is None and cache.get("c", 0) is actor
    keys = ContextKeys(secret=SECRET, audience=KEYS.audience, issuer=KEYS.issuer)
    with pytest.raises(Unauthenticated):
        verify_context_token("not-a-token", keys)
    assert len(keys.verified) == 0


def _keys_with_refusals(clock: list[float], max_entries: int = 10_000) -> ContextKeys:
    return ContextKeys(
        secret=SECRET,
        audience=KEYS.audience,
        issuer=KEYS.issuer,
        refused=RefusedTokens(max_entries=max_entries, hold_seconds=60, clock=lambda: clock[0]),
    )


def test_a_forged_token_refused_once_is_refused_again_without_a_verification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 45: a flood repeating one forged token (well formed, wrong signature) costs a
    lookup per call, not PyJWT's verification."""
    clock = [100.0]
    keys = _keys_with_refusals(clock)
    forged = jwt.encode(_claims(), "another-secret-that-is-also-long-enough", algorithm="HS256")
    decoded: list[str] = []
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        decoded.append(args[0])
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            verify_context_token(forged, keys)
    assert len(decoded) == 1 and len(keys.refused) == 1
    clock[0] += 60  # held for a while only: then verified in full again
    with pytest.raises(Unauthenticated):
        verify_context_token(forged, keys)
    assert len(decoded) == 2
    # A good token is not held up by another's refusal.
    assert verify_context_token(token(), keys).tenant == "tenant-a"


def test_a_token_not_yet_valid_is_not_kept_among_the_refused() -> None:
    keys = _keys_with_refusals([0.0])
    early = jwt.encode(_claims(nbf=int(time.time()) + 3600), SECRET, algorithm="HS256")
    ahead = jwt.encode(_claims(iat=int(time.time()) + 3600), SECRET, algorithm="HS256")
    for not_yet in (early, ahead):
        with pytest.raises(Unauthenticated):
            verify_context_token(not_yet, keys)
    assert len(keys.refused) == 0


def test_the_refused_tokens_are_bounded() -> None:
    keys = _keys_with_refusals([0.0], max_entries=2)
    for name in ("a.b.c", "d.e.f", "g.h.i"):
        with pytest.raises(Unauthenticated):
            verify_context_token(name, keys)
    assert len(keys.refused) == 2
    assert not keys.refused.holds("a.b.c") and keys.refused.holds("g.h.i")
