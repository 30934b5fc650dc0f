"""Signed actor context: the only source of tenant, user and roles.

A context is a compact JWS (JWT) issued by the trusted agent runtime. Keys: an HS256 secret
for local use, and EdDSA or RS256 public keys from a JWKS file for production, selected by
``kid`` (several at once during a rotation). Verification checks the signature, that the
algorithm is configured (never ``none``), ``exp``, ``nbf``, ``iat``, ``aud`` and ``iss``,
with a small clock skew.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from config.settings import Settings

# The call proof is the agent client's (one definition of what it signs, for the signer and
# the verifier).
from ratifier_client.proofs import CALL_PROOF_TYPE as CALL_PROOF_TYPE
from ratifier_client.proofs import PROOF_ALGORITHMS as PROOF_ALGORITHMS
from ratifier_client.proofs import PROOF_JWS
from ratifier_client.proofs import call_proof_claims as call_proof_claims
from ratifier_client.proofs import sign_call_proof as sign_call_proof
from schemas.envelopes import Actor, ValidatedCall
from schemas.errors import ConfigurationError, Unauthenticated

LOCAL_ALGORITHM = "HS256"
ASYMMETRIC_ALGORITHMS = frozenset({"EdDSA", "RS256"})
REQUIRED_CLAIMS = ("sub", "tenant", "exp", "iat", "aud", "iss")


class VerifiedTokens:
    """Actors of verified tokens by token, each until its ``exp`` (least recently used first
    out beyond ``max_entries``). Only successes are kept: a refused token is checked in full
    every time, and nothing here outlives the keys it was verified with."""

    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self._entries: OrderedDict[str, tuple[Actor, float]] = OrderedDict()
        self._max = max_entries
        self._clock = clock

    def get(self, token: str, leeway_seconds: int) -> Actor | None:
        found = self._entries.get(token)
        if found is None:
            return None
        actor, expires = found
        if self._clock() - leeway_seconds >= expires:  # PyJWT's own test of `exp`
            del self._entries[token]
            return None
        self._entries.move_to_end(token)
        return actor

    def put(self, token: str, actor: Actor, expires: float) -> None:
        self._entries[token] = (actor, expires)
        self._entries.move_to_end(token)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


# How long a token refused for good is answered from RefusedTokens without a verification.
REFUSED_HOLD_SECONDS = 60.0


class RefusedTokens:
    """Tokens refused for good (a signature, format, algorithm, key, audience or issuer that
    does not verify, or expired), each for ``hold_seconds`` (least recently refused first out
    beyond ``max_entries``): a flood repeating a forged token is refused by a lookup, not by a
    verification per call (issue 45; a well-formed wrong HS256 signature costs ~45 µs of
    PyJWT). A token not yet valid (``nbf``, ``iat`` ahead) is not kept: it may verify soon."""

    def __init__(
        self,
        max_entries: int = 10_000,
        hold_seconds: float = REFUSED_HOLD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._until: OrderedDict[str, float] = OrderedDict()
        self._max = max_entries
        self._hold = hold_seconds
        self._clock = clock

    def holds(self, token: str) -> bool:
        until = self._until.get(token)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[token]
            return False
        return True

    def add(self, token: str) -> None:
        self._until[token] = self._clock() + self._hold
        self._until.move_to_end(token)
        while len(self._until) > self._max:
            self._until.popitem(last=False)

    def __len__(self) -> int:
        return len(self._until)


class _NotYetValid(Unauthenticated):
    """A token refused only for now (``nbf`` or ``iat`` ahead of the clock): not kept."""


@dataclass(frozen=True, kw_only=True)
class ContextKeys:
    """Keys and expectations for verifying context tokens."""

    secret: str | None
    audience: str
    issuer: str
    leeway_seconds: int = 30
    # kid → public key, for EdDSA / RS256 tokens.
    public_keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    # Tenants whose calls must be bound to the agent runtime's key ("*": all tenants).
    binding_tenants: frozenset[str] = frozenset()
    # Tokens verified with these keys, until they expire: an agent reuses one token for many
    # calls, and its signature need not be checked again for each (verify_context_token).
    verified: VerifiedTokens = field(default_factory=VerifiedTokens, compare=False, repr=False)
    # Tokens refused for good, for a while: a repeated forged token is not verified again.
    refused: RefusedTokens = field(default_factory=RefusedTokens, compare=False, repr=False)

    def binding_required(self, tenant: str) -> bool:
        return "*" in self.binding_tenants or tenant in self.binding_tenants

    @property
    def algorithms(self) -> frozenset[str]:
        found = {k.algorithm_name for k in self.public_keys.values()}
        if self.secret is not None:
            found.add(LOCAL_ALGORITHM)
        return frozenset(found)


def load_jwks(path: Path) -> dict[str, jwt.PyJWK]:
    """Public keys by ``kid`` from a JWKS file; only EdDSA and RS256 keys are accepted."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        keys: dict[str, jwt.PyJWK] = {}
        for entry in document["keys"]:
            kid, alg = entry.get("kid"), entry.get("alg")
            if not kid or alg not in ASYMMETRIC_ALGORITHMS:
                raise ConfigurationError(
                    f"JWKS key {kid!r}: needs a 'kid' and 'alg' of {sorted(ASYMMETRIC_ALGORITHMS)}"
                )
            if "d" in entry:
                raise ConfigurationError(
                    f"JWKS key {kid!r} holds a private key; publish public keys"
                )
            keys[kid] = jwt.PyJWK(entry, algorithm=alg)
    except (OSError, ValueError, KeyError, TypeError, jwt.PyJWTError) as exc:
        raise ConfigurationError(f"cannot read JWKS file {path}: {exc}") from exc
    return keys


def context_keys(settings: Settings) -> ContextKeys:
    public_keys = load_jwks(Path(settings.context.jwks_file)) if settings.context.jwks_file else {}
    secret = settings.context.secret if settings.context.hs256 else None
    if secret is not None:
        # The built-in HS256 secret is public knowledge: development mode only.
        settings.require_key_material("RATIFIER_CONTEXT__SECRET")
    if secret is None and not public_keys:
        raise ConfigurationError("no context keys: enable HS256 or configure a JWKS file")
    return ContextKeys(
        secret=secret,
        audience=settings.context.audience,
        issuer=settings.context.issuer,
        leeway_seconds=settings.context.clock_skew_seconds,
        public_keys=public_keys,
        binding_tenants=frozenset(
            t.strip() for t in settings.context.call_binding_tenants.split(",") if t.strip()
        ),
    )


def issue_context_token(
    keys: ContextKeys,
    *,
    sub: str,
    tenant: str,
    roles: tuple[str, ...] = (),
    sid: str | None = None,
    ttl_seconds: int = 3600,
    now: float | None = None,
    signing_key: Any = None,
    kid: str | None = None,
    algorithm: str = LOCAL_ALGORITHM,
    cnf_jwk: dict[str, Any] | None = None,
) -> str:
    """Issue a context token: HS256 with the local secret by default (demos, tests, local
    agents), or signed with ``signing_key`` (a private key) under ``kid``. ``cnf_jwk`` binds
    the token to the agent runtime's public key (RFC 7800): calls made with it must carry a
    proof signed with that key (`sign_call_proof`)."""
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
    if cnf_jwk is not None:
        claims["cnf"] = {"jwk": cnf_jwk}
    if signing_key is None:
        if keys.secret is None:
            raise ConfigurationError("HS256 is not enabled; pass a signing key")
        return jwt.encode(claims, keys.secret, algorithm=LOCAL_ALGORITHM)
    return jwt.encode(claims, signing_key, algorithm=algorithm, headers={"kid": kid})


def _key_for(token: str, keys: ContextKeys) -> tuple[Any, str]:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise Unauthenticated() from exc
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in keys.algorithms:
        raise Unauthenticated()  # includes "none" and anything not configured
    if alg == LOCAL_ALGORITHM:
        return keys.secret, alg
    kid = header.get("kid")
    key = keys.public_keys.get(kid) if isinstance(kid, str) else None
    if key is None or key.algorithm_name != alg:
        raise Unauthenticated()  # unknown kid (e.g. rotated out) or alg/key mismatch
    return key.key, alg


def verify_context_token(token: str, keys: ContextKeys, *, check_expiry: bool = True) -> Actor:
    """Verify ``token`` and return the actor it names, or raise `Unauthenticated`.

    ``check_expiry=False`` is for policy replay only: historical tokens are long expired, but
    their signature, audience and issuer still prove who asked.

    A token verified before (with expiry) is answered from ``keys.verified`` until it
    expires; one refused for good, from ``keys.refused`` for a while."""
    if not check_expiry:
        return _verified(token, keys, check_expiry=False)
    known = keys.verified.get(token, keys.leeway_seconds)
    if known is not None:
        return known
    if keys.refused.holds(token):
        raise Unauthenticated()
    try:
        return _verified(token, keys, check_expiry=True)
    except _NotYetValid:
        raise
    except Unauthenticated:
        keys.refused.add(token)
        raise


def _verified(token: str, keys: ContextKeys, *, check_expiry: bool) -> Actor:
    """:func:`verify_context_token` without the caches (it keeps a success in
    ``keys.verified``)."""
    key, alg = _key_for(token, keys)
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[alg],
            audience=keys.audience,
            issuer=keys.issuer,
            leeway=keys.leeway_seconds,
            options={
                "require": list(REQUIRED_CLAIMS),
                "verify_exp": check_expiry,
                "verify_nbf": check_expiry,
                "verify_iat": check_expiry,
            },
        )
    except jwt.ImmatureSignatureError as exc:
        raise _NotYetValid() from exc
    except jwt.PyJWTError as exc:
        raise Unauthenticated() from exc
    iat = claims.get("iat")
    if check_expiry and isinstance(iat, int | float) and iat > time.time() + keys.leeway_seconds:
        raise _NotYetValid()  # issued in the future
    roles = claims.get("roles", [])
    sid = claims.get("sid")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise Unauthenticated()
    try:
        actor = Actor(
            sub=str(claims["sub"]),
            tenant=str(claims["tenant"]),
            roles=tuple(roles),
            sid=sid if isinstance(sid, str) else None,
        )
    except ValueError as exc:
        raise Unauthenticated() from exc
    expires = claims["exp"]
    if check_expiry and isinstance(expires, int | float):
        keys.verified.put(token, actor, float(expires))
    return actor


# -- call binding (RFC 7800 `cnf` + a per-call proof, DPoP-style) --------------------------


def call_binding_problem(call: ValidatedCall, tenant: str, keys: ContextKeys) -> bool:
    """Whether ``call`` fails the binding its tenant requires: its (already verified) token
    must name a key in ``cnf.jwk`` and its proof must be signed with that key over this very
    call. A token copied from `calls.proposed` onto a new call mints nothing."""
    if not keys.binding_required(tenant):
        return False
    if not call.proof:
        return True
    try:
        claims = jwt.decode(call.context, options={"verify_signature": False})
        jwk = claims["cnf"]["jwk"]
        header = PROOF_JWS.get_unverified_header(call.proof)
        alg = header.get("alg")
        if header.get("typ") != CALL_PROOF_TYPE or alg not in PROOF_ALGORITHMS:
            return True
        key = jwt.PyJWK(jwk, algorithm=alg)
        payload = PROOF_JWS.decode_complete(call.proof, key=key.key, algorithms=[alg])["payload"]
        signed = json.loads(payload)
    except (jwt.PyJWTError, KeyError, TypeError, ValueError):
        return True
    expected = call_proof_claims(
        call_id=call.call_id,
        idempotency_key=call.idempotency_key,
        tool=call.tool,
        arguments=call.arguments,
        context=call.context,
    )
    iat = signed.get("iat") if isinstance(signed, dict) else None
    if not isinstance(iat, int) or iat > time.time() + keys.leeway_seconds:
        return True
    return {k: signed.get(k) for k in expected} != expected
