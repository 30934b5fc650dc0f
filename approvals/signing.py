"""Signed approval statements: decisions bound to one call, and the receipts the executor
re-verifies at commit time. Pure functions over keys and values; no I/O but reading key
files at start (`approval_keys`).

A decision is a compact JWS (``typ`` ``ratifier-decision+jws``, EdDSA or ES256) over a
`DecisionStatement`. It is signed by the approval service (after it authenticated the human:
HTTP API, CLI, dashboard) or by an approver's own key published in the approvers' JWKS, whose
entries name the identity the key belongs to. A receipt is signed by the service only
(``typ`` ``ratifier-receipt+jws``): the two types never stand in for each other.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pydantic import ValidationError

from config.settings import Settings
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    ApprovalReceipt,
    ApprovalVerdict,
    DecisionApprover,
    DecisionKind,
    DecisionStatement,
)
from schemas.errors import ConfigurationError

DECISION_TYPE = "ratifier-decision+jws"
RECEIPT_TYPE = "ratifier-receipt+jws"
ALGORITHMS = frozenset({"EdDSA", "ES256"})
SERVICE = "service"  # the signer name of decisions signed with a service key

_JWS = jwt.PyJWS(algorithms=sorted(ALGORITHMS))


class DecisionRefusal(StrEnum):
    """Why a decision (or receipt) acts on nothing. Each is audited by name."""

    UNSIGNED = "unsigned"  # not a v2 signed decision (e.g. a v1 record with a bearer token)
    MALFORMED = "malformed"  # the statement is not a DecisionStatement
    BAD_SIGNATURE = "bad_signature"  # signature, algorithm or type does not verify
    UNKNOWN_KEY = "unknown_key"  # kid not trusted (never, or rotated out)
    SIGNER_MISMATCH = "signer_mismatch"  # an approver key signed for someone else
    BODY_MISMATCH = "body_mismatch"  # the record's readable call/decision id ≠ the signed ones
    KEY_MISMATCH = "key_mismatch"  # the Kafka key ≠ the signed call id
    CALL_MISMATCH = "call_mismatch"  # signed for another call than the pending one
    TENANT_MISMATCH = "tenant_mismatch"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    POLICY_VERSION_MISMATCH = "policy_version_mismatch"
    DECISION_REUSED = "decision_reused"  # this decision id already counted (for any call)
    STATEMENT_EXPIRED = "statement_expired"  # past its not_after (or issued in the future)
    REQUEST_EXPIRED = "request_expired"
    NOT_PENDING = "not_pending"  # the approval is already decided (a replay) or absent
    APPROVER_NOT_PERMITTED = "approver_not_permitted"
    SELF_APPROVAL = "self_approval"
    SAME_APPROVER = "same_approver"  # four-eyes: this approver already counted
    EDIT_WITHOUT_ARGUMENTS = "edit_without_arguments"
    ARGUMENTS_WITHOUT_EDIT = "arguments_without_edit"  # only an edit carries arguments
    NOT_APPROVED = "not_approved"  # a receipt that approves nothing


@dataclass(frozen=True, kw_only=True)
class ApproverKey:
    """An approver's own public key, and the identity it speaks for."""

    key: Any
    algorithm: str
    sub: str
    tenant: str
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ApprovalKeys:
    signing_key: Any
    kid: str
    algorithm: str
    # kid → (public key, algorithm): the current service key and older ones (rotation).
    service_keys: dict[str, tuple[Any, str]] = field(default_factory=dict)
    approver_keys: dict[str, ApproverKey] = field(default_factory=dict)
    leeway_seconds: int = 30
    decision_validity: timedelta = timedelta(minutes=15)


@dataclass(frozen=True, kw_only=True)
class VerifiedDecision:
    statement: DecisionStatement
    signer: str  # SERVICE, or the approver key's kid


def local_signing_key(seed: str) -> ed25519.Ed25519PrivateKey:
    """The local-development service key: Ed25519, derived from the seed setting, so that
    every process of a local deployment (workers, executor, CLI, dashboard) has the same."""
    digest = hashlib.sha256(b"ratifier approval signing key\0" + seed.encode()).digest()
    return ed25519.Ed25519PrivateKey.from_private_bytes(digest)


def _algorithm_of(key: Any) -> str:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1":
        return "ES256"
    raise ConfigurationError("the approval signing key must be Ed25519 or P-256")


def _read_jwks(path: Path) -> list[dict[str, Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        entries = document["keys"]
        if not isinstance(entries, list):
            raise TypeError("'keys' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"cannot read JWKS file {path}: {exc}") from exc
    for entry in entries:
        kid, alg = entry.get("kid"), entry.get("alg")
        if not kid or alg not in ALGORITHMS:
            raise ConfigurationError(
                f"JWKS key {kid!r}: needs a 'kid' and 'alg' of {sorted(ALGORITHMS)}"
            )
        if "d" in entry:
            raise ConfigurationError(f"JWKS key {kid!r} holds a private key; publish public keys")
    return entries


def _public(entry: dict[str, Any]) -> Any:
    try:
        return jwt.PyJWK(entry, algorithm=entry["alg"]).key
    except jwt.PyJWTError as exc:
        raise ConfigurationError(f"JWKS key {entry.get('kid')!r}: {exc}") from exc


def approval_keys(settings: Settings) -> ApprovalKeys:
    """The service's signing key and every key a decision or receipt may be signed with."""
    if settings.approvals.signing_key_file:
        try:
            pem = Path(settings.approvals.signing_key_file).read_bytes()
            signing_key: Any = serialization.load_pem_private_key(pem, password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"cannot read the approval signing key: {exc}") from exc
    else:
        # The seed-derived key is public knowledge: development mode only.
        settings.require_key_material("RATIFIER_APPROVALS__SIGNING_KEY_FILE")
        signing_key = local_signing_key(settings.approvals.signing_seed)
    algorithm = _algorithm_of(signing_key)
    service = {settings.approvals.signing_kid: (signing_key.public_key(), algorithm)}
    if settings.approvals.service_jwks_file:
        for entry in _read_jwks(Path(settings.approvals.service_jwks_file)):
            service.setdefault(entry["kid"], (_public(entry), entry["alg"]))
    approvers: dict[str, ApproverKey] = {}
    if settings.approvals.approver_jwks_file:
        for entry in _read_jwks(Path(settings.approvals.approver_jwks_file)):
            sub, tenant = entry.get("sub"), entry.get("tenant")
            if not isinstance(sub, str) or not isinstance(tenant, str):
                raise ConfigurationError(
                    f"approver key {entry['kid']!r} must name its 'sub' and 'tenant'"
                )
            if entry["kid"] in service:
                raise ConfigurationError(f"approver key {entry['kid']!r} reuses a service kid")
            approvers[entry["kid"]] = ApproverKey(
                key=_public(entry),
                algorithm=entry["alg"],
                sub=sub,
                tenant=tenant,
                roles=tuple(str(r) for r in entry.get("roles") or ()),
            )
    return ApprovalKeys(
        signing_key=signing_key,
        kid=settings.approvals.signing_kid,
        algorithm=algorithm,
        service_keys=service,
        approver_keys=approvers,
        leeway_seconds=settings.context.clock_skew_seconds,
        decision_validity=timedelta(seconds=settings.approvals.decision_validity_seconds),
    )


def _canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _sign(payload: bytes, typ: str, keys: ApprovalKeys, *, key: Any = None, kid: str = "") -> str:
    signing_key = key if key is not None else keys.signing_key
    return _JWS.encode(
        payload,
        signing_key,
        algorithm=_algorithm_of(signing_key),
        headers={"kid": kid or keys.kid, "typ": typ},
    )


# -- decisions ---------------------------------------------------------------------------


def statement_for(
    *,
    call_id: str,
    tenant: str,
    fingerprint: str,
    approver: Actor,
    verdict: ApprovalVerdict,
    now: datetime,
    validity: timedelta,
    not_after: datetime | None = None,
    reason: str | None = None,
    arguments: dict[str, Any] | None = None,
    kind: DecisionKind = DecisionKind.APPROVER,
    decision_id: str | None = None,
) -> DecisionStatement:
    """What an authenticated human decided about one call, ready to sign. Valid for
    ``validity`` and never past ``not_after`` (the request's own expiry)."""
    until = now + validity
    return DecisionStatement(
        decision_id=decision_id or f"d-{uuid.uuid4().hex}",
        call_id=call_id,
        tenant=tenant,
        fingerprint=fingerprint,
        decision=verdict,
        arguments=arguments,
        approver=DecisionApprover(sub=approver.sub, tenant=approver.tenant, roles=approver.roles),
        kind=kind,
        reason=reason,
        issued_at=now,
        not_after=min(until, not_after) if not_after is not None else until,
    )


def sign_decision(
    statement: DecisionStatement, keys: ApprovalKeys, *, key: Any = None, kid: str = ""
) -> ApprovalDecision:
    """The `approvals.decided` record of ``statement``: signed with the service key, or with
    an approver's own ``key`` under ``kid`` (agents and tests holding one)."""
    jws = _sign(
        _canonical(statement.model_dump(mode="json")), DECISION_TYPE, keys, key=key, kid=kid
    )
    return ApprovalDecision(
        call_id=statement.call_id,
        decision_id=statement.decision_id,
        decision=statement.decision,
        decided_by=statement.approver.sub,
        statement=jws,
    )


def _verified_payload(
    jws: str, typ: str, keys: ApprovalKeys, *, approvers: bool
) -> tuple[bytes, str] | DecisionRefusal:
    """The payload and the signer (SERVICE or an approver kid), or why not."""
    try:
        header = _JWS.get_unverified_header(jws)
    except jwt.PyJWTError:
        return DecisionRefusal.BAD_SIGNATURE
    alg, kid = header.get("alg"), header.get("kid")
    if header.get("typ") != typ or alg not in ALGORITHMS or not isinstance(kid, str):
        return DecisionRefusal.BAD_SIGNATURE
    signer = SERVICE
    if kid in keys.service_keys:
        public, expected = keys.service_keys[kid]
    elif approvers and kid in keys.approver_keys:
        public, expected, signer = (
            keys.approver_keys[kid].key,
            keys.approver_keys[kid].algorithm,
            kid,
        )
    else:
        return DecisionRefusal.UNKNOWN_KEY
    if alg != expected:
        return DecisionRefusal.BAD_SIGNATURE
    try:
        decoded = _JWS.decode_complete(jws, key=public, algorithms=[expected])
    except jwt.PyJWTError:
        return DecisionRefusal.BAD_SIGNATURE
    payload = decoded["payload"]
    return (payload, signer) if isinstance(payload, bytes) else DecisionRefusal.MALFORMED


def verify_decision(
    record: ApprovalDecision, *, kafka_key: str | None, keys: ApprovalKeys, now: datetime
) -> VerifiedDecision | DecisionRefusal:
    """The statement of a decision record if its signature, signer, key and validity hold.
    What it may do to a pending call is decided against that call (`streams.approval`)."""
    verified = _verified_payload(record.statement, DECISION_TYPE, keys, approvers=True)
    if isinstance(verified, DecisionRefusal):
        return verified
    payload, signer = verified
    try:
        statement = DecisionStatement.model_validate_json(payload)
    except ValidationError:
        return DecisionRefusal.MALFORMED
    readable = (record.call_id, record.decision_id, record.decision, record.decided_by)
    signed = (statement.call_id, statement.decision_id, statement.decision, statement.approver.sub)
    if readable != signed:
        return DecisionRefusal.BODY_MISMATCH
    if kafka_key != statement.call_id:
        return DecisionRefusal.KEY_MISMATCH
    if signer != SERVICE:
        owner = keys.approver_keys[signer]
        if (owner.sub, owner.tenant) != (statement.approver.sub, statement.approver.tenant):
            return DecisionRefusal.SIGNER_MISMATCH
        # The key's roles are the approver's roles: a signer cannot grant itself more.
        statement = statement.model_copy(
            update={"approver": statement.approver.model_copy(update={"roles": owner.roles})}
        )
    skew = timedelta(seconds=keys.leeway_seconds)
    if statement.issued_at > now + skew or now > statement.not_after + skew:
        return DecisionRefusal.STATEMENT_EXPIRED
    return VerifiedDecision(statement=statement, signer=signer)


# -- receipts ----------------------------------------------------------------------------


def sign_receipt(receipt: ApprovalReceipt, keys: ApprovalKeys) -> ApprovalReceipt:
    """``receipt`` with the service's signature over its other fields."""
    unsigned = receipt.model_copy(update={"signature": None})
    jws = _sign(_canonical(unsigned.signed_part()), RECEIPT_TYPE, keys)
    return unsigned.model_copy(update={"signature": jws})


def receipt_refusal(
    receipt: ApprovalReceipt | None,
    *,
    call_id: str,
    tenant: str,
    fingerprint: str,
    policy_version: str,
    keys: ApprovalKeys,
    now: datetime,
) -> DecisionRefusal | None:
    """Why ``receipt`` does not approve this call, or None. The approval-join and the
    executor (at commit time) both ask this."""
    if receipt is None or receipt.signature is None:
        return DecisionRefusal.UNSIGNED
    verified = _verified_payload(receipt.signature, RECEIPT_TYPE, keys, approvers=False)
    if isinstance(verified, DecisionRefusal):
        return verified
    payload, _ = verified
    try:
        signed = ApprovalReceipt.model_validate_json(payload)
    except ValidationError:
        return DecisionRefusal.MALFORMED
    if signed.signed_part() != receipt.signed_part():
        return DecisionRefusal.BODY_MISMATCH
    if signed.call_id != call_id:
        return DecisionRefusal.CALL_MISMATCH
    if signed.tenant != tenant:
        return DecisionRefusal.TENANT_MISMATCH
    if signed.fingerprint != fingerprint:
        return DecisionRefusal.FINGERPRINT_MISMATCH
    if signed.policy_version != policy_version:
        return DecisionRefusal.POLICY_VERSION_MISMATCH
    if signed.expires_at <= now:
        return DecisionRefusal.REQUEST_EXPIRED
    return None


def receipt_for(
    *,
    call_id: str,
    tenant: str,
    fingerprint: str,
    policy_version: str,
    approver: str,
    decided_at: datetime,
    expires_at: datetime,
    keys: ApprovalKeys,
    basis: str = "approver",
) -> ApprovalReceipt:
    """A signed receipt for one approver's approval of one call (tools and tests that commit
    commands directly; the approval-join builds its own from the decisions it counted)."""
    return sign_receipt(
        ApprovalReceipt(
            approver=approver,
            decided_at=decided_at,
            expires_at=expires_at,
            fingerprint=fingerprint,
            call_id=call_id,
            tenant=tenant,
            policy_version=policy_version,
            approvers=(approver,),
            basis=basis,
        ),
        keys,
    )
