"""Call binding: a context token naming the runtime's key (`cnf`) and a proof per call."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from jwt.algorithms import OKPAlgorithm

from ratifier_client.client import RatifierClient
from runtime.identity import call_binding_problem, issue_context_token, sign_call_proof
from schemas.envelopes import ValidatedCall
from tests.unit.conftest import KEYS, NOW

BOUND = replace(KEYS, binding_tenants=frozenset({"tenant-a"}))
RUNTIME = ed25519.Ed25519PrivateKey.generate()
JWK: dict[str, Any] = OKPAlgorithm.to_jwk(RUNTIME.public_key(), as_dict=True)
ARGS = {"payment_id": "pay_A1001"}


def call(call_id: str, context: str, proof: str | None, **kw: Any) -> ValidatedCall:
    return ValidatedCall(
        call_id=call_id,
        idempotency_key=kw.get("idempotency_key", call_id),
        tool="get_payment",
        arguments=kw.get("arguments", ARGS),
        context=context,
        proposed_at=NOW,
        validated_at=NOW,
        proof=proof,
    )


def proof_for(call_id: str, context: str, key: Any = RUNTIME, **kw: Any) -> str:
    return sign_call_proof(
        key,
        call_id=call_id,
        idempotency_key=kw.get("idempotency_key", call_id),
        tool="get_payment",
        arguments=kw.get("arguments", ARGS),
        context=context,
    )


def test_a_bound_call_passes_and_a_copied_token_mints_nothing() -> None:
    token = issue_context_token(BOUND, sub="agent-1", tenant="tenant-a", cnf_jwk=JWK)
    good = call("c-1", token, proof_for("c-1", token))
    assert not call_binding_problem(good, "tenant-a", BOUND)
    # The token copied onto a new call: without a proof, with the old one, or with changes.
    assert call_binding_problem(call("c-2", token, None), "tenant-a", BOUND)
    assert call_binding_problem(call("c-2", token, good.proof), "tenant-a", BOUND)
    changed = call("c-1", token, good.proof, arguments={"payment_id": "pay_A1002"})
    assert call_binding_problem(changed, "tenant-a", BOUND)
    stranger = ed25519.Ed25519PrivateKey.generate()
    assert call_binding_problem(
        call("c-3", token, proof_for("c-3", token, key=stranger)), "tenant-a", BOUND
    )
    # A proof is bound to its token too (ath): another token with the same key does not do.
    other = issue_context_token(BOUND, sub="agent-2", tenant="tenant-a", cnf_jwk=JWK)
    assert call_binding_problem(call("c-1", other, good.proof), "tenant-a", BOUND)


def test_binding_is_per_tenant_and_needs_a_cnf_key() -> None:
    unbound = issue_context_token(BOUND, sub="agent-1", tenant="tenant-a")
    assert call_binding_problem(call("c-1", unbound, proof_for("c-1", unbound)), "tenant-a", BOUND)
    assert not call_binding_problem(call("c-1", unbound, None), "tenant-b", BOUND)
    assert not call_binding_problem(call("c-1", unbound, None), "tenant-a", KEYS)
    everyone = replace(KEYS, binding_tenants=frozenset({"*"}))
    assert call_binding_problem(call("c-1", unbound, None), "tenant-z", everyone)


def test_the_agent_client_signs_each_call_when_it_holds_the_runtime_key() -> None:
    token = issue_context_token(BOUND, sub="agent-1", tenant="tenant-a", cnf_jwk=JWK)
    signing = RatifierClient(bootstrap="127.0.0.1:1", proof_key=RUNTIME)
    sent = json.loads(signing._envelope("c-9", "get_payment", ARGS, token, "c-9"))
    assert not call_binding_problem(call("c-9", token, sent["proof"]), "tenant-a", BOUND)
    unsigned = json.loads(
        RatifierClient(bootstrap="127.0.0.1:1")._envelope("c-9", "get_payment", ARGS, token, "c-9")
    )
    assert "proof" not in unsigned
    assert call_binding_problem(call("c-9", token, None), "tenant-a", BOUND)
