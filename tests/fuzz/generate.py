"""Hostile and ordinary records for `calls.proposed`, from a seeded random source.

One generator serves both fuzz paths: the pure stage functions (driven by hypothesis, which
hands it a `random.Random`) and the real pipeline through Kafka (a plain seeded one). Each
record says whether a call id can be read from it, so that the checker knows what it must
get back: an outcome for that call id, or a dead letter with the record's digest.
"""

from __future__ import annotations

import base64
import json
import random
import string
import time
from dataclasses import dataclass
from typing import Any

import jwt

from runtime.identity import ContextKeys, issue_context_token

GOOD_ARGUMENTS: dict[str, list[dict[str, Any]]] = {
    "get_payment": [{"payment_id": "pay_A1001"}, {"payment_id": "pay_B2001"}],
    "get_refund_policy": [{}],
    "get_refund_status": [{"refund_id": "ref_missing"}],
    "propose_refund": [{"payment_id": "pay_A1002", "amount_minor": 1, "reason": "fuzz"}],
    "add_payout_account": [
        {"payment_id": "pay_A1001", "account_holder": "Fuzz", "account_number": "DE0012345678"}
    ],
    "delete_payment_method": [{"payment_method_id": "pm_A1"}],
}
TOOLS = sorted(GOOD_ARGUMENTS)
CONFUSABLE_TOOLS = [
    "get_paym\u0435nt",
    "Get_Payment",
    "get_payment ",
    "get\u200bpayment",
    "",
    "x" * 200,
]
TENANTS = ["tenant-a", "tenant-b", "tenant-c"]
ROLES = [("support",), ("refund",), ("approver",), (), ("admin", "support")]
STRANGE_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    -(2**63) - 1,
    10**400,
    1e308,
    -0.0,
    "",
    "\x00",
    "\ud800",
    "é" * 50,
    "a" * 9000,
    [],
    {},
    [[[[[]]]]],
    {"$ne": 1},
    "'; DROP TABLE payments; --",
]


@dataclass(frozen=True)
class FuzzRecord:
    kind: str
    call_id: str | None  # None: no call id can be read; a dead letter must answer
    raw: bytes


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, n)))


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"d": value}
    return value


def _segment(claims: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")


def token_variant(rng: random.Random, keys: ContextKeys) -> str:
    """A context token: mostly valid, often forged or broken."""
    tenant, roles = rng.choice(TENANTS), rng.choice(ROLES)
    choice = rng.randrange(12)
    if choice < 5:
        return issue_context_token(
            keys, sub=f"agent-{rng.randrange(5)}", tenant=tenant, roles=roles
        )
    valid = issue_context_token(keys, sub="agent-1", tenant=tenant, roles=roles)
    head, body, signature = valid.split(".")
    now = int(time.time())
    claims = {"sub": "agent-1", "tenant": tenant, "roles": list(roles), "aud": keys.audience}
    forged: list[str] = [
        f"{head}.{body}.{signature[::-1]}",  # bad signature
        jwt.encode({**claims, "iss": keys.issuer, "exp": now + 60}, key="", algorithm="none"),
        jwt.encode({**claims, "iss": keys.issuer, "exp": now - 3600}, "x" * 40),  # wrong key
        issue_context_token(keys, sub="agent-1", tenant=tenant, ttl_seconds=-3600),  # expired
        base64.urlsafe_b64encode(json.dumps({"alg": "HS256"}).encode()).decode() + "..",
        _text(rng, 40) or "x",
        f"{head}.{_segment({**claims, 'tenant': 'tenant-z'})}.{signature}",  # swapped claims
    ]
    return rng.choice(forged)


def _arguments(rng: random.Random, tool: str) -> Any:
    base = dict(rng.choice(GOOD_ARGUMENTS.get(tool, [{}])))
    mutation = rng.randrange(10)
    if mutation < 4 or (not base and mutation < 6):
        return base
    if mutation == 4:  # an extra field, often an identity smuggled in
        base[rng.choice(["tenant_id", "tenant", "user", "_meta", "extra"])] = rng.choice(TENANTS)
        return base
    if mutation == 5 and base:  # a field of the wrong type or value
        base[rng.choice(sorted(base))] = rng.choice(STRANGE_VALUES)
        return base
    if mutation == 6:
        return rng.choice([[], "not an object", 7, None, json.dumps(base)])
    if mutation == 7:
        return {"payment_id": _nested(rng.randint(10, 40))}
    if mutation == 8 and base:
        base.pop(rng.choice(sorted(base)))
        return base
    return {_text(rng, 10): rng.choice(STRANGE_VALUES) for _ in range(rng.randint(0, 4))}


def record(rng: random.Random, keys: ContextKeys, number: int, *, run: str) -> FuzzRecord:
    """One record for `calls.proposed`; ``number`` and ``run`` make its call id unique."""
    call_id = f"fz-{run}-{number}"
    shape = rng.randrange(20)
    if shape < 12:  # an envelope with a readable call id
        tool = rng.choice(TOOLS) if rng.random() < 0.85 else rng.choice(CONFUSABLE_TOOLS)
        envelope: dict[str, Any] = {
            "v": 1,
            "call_id": call_id,
            "tool": tool,
            "arguments": _arguments(rng, tool),
            "context": token_variant(rng, keys),
            "proposed_at": "2026-12-01T00:00:00Z",
        }
        if rng.random() < 0.2:
            envelope["idempotency_key"] = rng.choice(
                [call_id, f"k-{run}-{number % 7}", 5, "", None]
            )
        if rng.random() < 0.1:
            envelope[rng.choice(["v", "proposed_at", "format", "call"])] = rng.choice(
                STRANGE_VALUES
            )
        if rng.random() < 0.05:
            del envelope[rng.choice(["tool", "arguments", "context", "proposed_at"])]
        raw = json.dumps(envelope).encode()
        if rng.random() < 0.05:  # duplicate keys: the last call_id is the same one
            raw = raw[:-1] + b', "tool": "get_payment"}'
        return FuzzRecord(kind="envelope", call_id=call_id, raw=raw)
    if shape < 14:  # readable call id, hopeless envelope (wrong version, oversized)
        if rng.random() < 0.5:
            raw = json.dumps({"v": rng.choice([0, 2, "1", None]), "call_id": call_id}).encode()
            return FuzzRecord(kind="wrong-version", call_id=call_id, raw=raw)
        padding = "p" * rng.randint(70_000, 200_000)
        raw = json.dumps(
            {"v": 1, "call_id": call_id, "tool": "get_payment", "pad": padding}
        ).encode()
        return FuzzRecord(kind="oversized", call_id=call_id, raw=raw)
    if shape < 16:  # not JSON, or not UTF-8
        raw = rng.choice(
            [
                bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))),
                b"\xff\xfe" + call_id.encode(),
                (_text(rng, 200) + call_id).encode(),
            ]
        )
        return FuzzRecord(kind="bytes", call_id=None, raw=raw)
    if shape < 18:  # JSON, but not an envelope object
        value = rng.choice([[], 1, "call", None, [call_id], {"call_id": 5}, {"callid": call_id}])
        return FuzzRecord(kind="json", call_id=None, raw=json.dumps(value).encode())
    # an invalid call id
    bad_id = rng.choice(["", " ", "a" * 200, "id with spaces", "ü", "\x00"])
    raw = json.dumps({"v": 1, "call_id": bad_id, "tool": "get_payment", "arguments": {}}).encode()
    return FuzzRecord(kind="bad-call-id", call_id=None, raw=raw)


# --- decisions on `approvals.decided` -------------------------------------------------------

DECISION_KINDS = (
    "approve",
    "reject",
    "other_call",
    "other_tenant",
    "other_fingerprint",
    "wrong_key",
    "tampered",
    "expired",
    "no_rights",
    "self_approval",
    "not_json",
    "json_not_object",
    "v1_bearer",
    "wrong_version",
    "random_bytes",
)


@dataclass(frozen=True)
class FuzzDecision:
    """A record for `approvals.decided` about the pending call ``call_id`` (its Kafka key),
    and what it may do: ``commits`` only for a valid approval of exactly that call,
    ``readable`` when it parses as a decision record at all."""

    kind: str
    raw: bytes
    commits: bool
    rejects: bool
    readable: bool


def decision_record(
    rng: random.Random,
    *,
    call_id: str,
    tenant: str,
    fingerprint: str,
    requester: str,
    keys: Any,
    wrong_keys: Any,
    now: Any,
) -> FuzzDecision:
    """One hostile or ordinary decision about the pending call; ``keys`` are the approval
    service's signing keys, ``wrong_keys`` someone else's."""
    from datetime import timedelta

    from approvals.signing import sign_decision, statement_for
    from schemas.envelopes import Actor, ApprovalVerdict

    kind = rng.choice(DECISION_KINDS)
    boss = Actor(sub=f"boss-{rng.randint(0, 9)}", tenant=tenant, roles=("approver",))
    body: dict[str, Any] = {
        "call_id": call_id,
        "tenant": tenant,
        "fingerprint": fingerprint,
        "approver": boss,
        "verdict": ApprovalVerdict.APPROVE,
        "now": now,
        "validity": timedelta(minutes=rng.choice([1, 5, 15])),
    }
    signing = keys
    if kind == "reject":
        body["verdict"] = ApprovalVerdict.REJECT
    elif kind == "other_call":
        body["call_id"] = f"{call_id}-{rng.getrandbits(16):04x}"
    elif kind == "other_tenant":
        body["tenant"] = "tenant-b"
        body["approver"] = Actor(sub=boss.sub, tenant="tenant-b", roles=("approver",))
    elif kind == "other_fingerprint":
        body["fingerprint"] = "".join(rng.choice("0123456789abcdef") for _ in range(64))
    elif kind == "wrong_key":
        signing = wrong_keys
    elif kind == "expired":
        body["now"] = now - timedelta(hours=rng.randint(1, 48))
    elif kind == "no_rights":
        body["approver"] = Actor(sub=boss.sub, tenant=tenant, roles=rng.choice([(), ("support",)]))
    elif kind == "self_approval":
        body["approver"] = Actor(sub=requester, tenant=tenant, roles=("approver",))
    if kind in ("not_json", "json_not_object", "v1_bearer", "wrong_version", "random_bytes"):
        raw: bytes
        if kind == "not_json":
            raw = ("{" + _text(rng, rng.randint(0, 60))).encode()
        elif kind == "json_not_object":
            raw = json.dumps(rng.choice([[], [call_id], 1, "approve", None])).encode()
        elif kind == "v1_bearer":
            raw = json.dumps(
                {
                    "v": 1,
                    "call_id": call_id,
                    "approver": "eyJhbGciOi.bearer.token",
                    "verdict": "approve",
                }
            ).encode()
        elif kind == "wrong_version":
            good = sign_decision(statement_for(**body), keys)
            raw = json.dumps(
                {**json.loads(good.to_bytes()), "v": rng.choice([0, 1, 3, 99])}
            ).encode()
        else:
            raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
        return FuzzDecision(kind=kind, raw=raw, commits=False, rejects=False, readable=False)
    record = sign_decision(statement_for(**body), signing)
    raw = record.to_bytes()
    if kind == "tampered":
        data = json.loads(raw)
        header, payload, signature = data["statement"].split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["fingerprint"] = "f" * 64 if claims["fingerprint"] != "f" * 64 else "e" * 64
        forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        data["statement"] = f"{header}.{forged}.{signature}"
        raw = json.dumps(data).encode()
    return FuzzDecision(
        kind=kind,
        raw=raw,
        commits=kind == "approve",
        rejects=kind == "reject",
        readable=True,
    )
