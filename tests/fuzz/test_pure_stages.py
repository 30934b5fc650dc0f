"""Fuzzing the pure stage functions: whatever arrives, one typed answer and no exception."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.reference import catalog
from commands.validate import Limits
from runtime.identity import ContextKeys, verify_context_token
from schemas.envelopes import DeadLetter, Outcome, SourcePosition, ValidatedCall
from schemas.errors import Unauthenticated
from streams.validator import on_proposed
from tests.fuzz.generate import record, token_variant
from tests.fuzz.scale import PURE_EXAMPLES, PURE_TIMEOUT
from tests.unit.conftest import NOW

KEYS = ContextKeys(
    secret="fuzz-secret-that-is-long-enough-for-hs256", audience="ratifier", issuer="ratifier-local"
)
SOURCE = SourcePosition(topic="calls.proposed", partition=0, offset=0)
FUZZ = settings(
    max_examples=PURE_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.timeout(PURE_TIMEOUT)
@FUZZ
@given(st.randoms(use_true_random=False), st.integers(min_value=0, max_value=10**9))
def test_every_proposed_record_gets_one_typed_answer(rng: random.Random, number: int) -> None:
    fuzzed = record(rng, KEYS, number, run="pure")
    emits = on_proposed(
        fuzzed.raw, source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id=None
    )
    kinds = [type(e.value) for e in emits]
    assert kinds in ([ValidatedCall], [Outcome], [DeadLetter], [DeadLetter, Outcome])
    for emit in emits:
        assert len(emit.value.to_bytes()) < 64 * 1024  # every answer fits where its input did
    if fuzzed.call_id is not None:
        answered = {e.value.call_id for e in emits if isinstance(e.value, Outcome | ValidatedCall)}
        assert answered == {fuzzed.call_id}
    else:
        letters = [e.value for e in emits if isinstance(e.value, DeadLetter)]
        assert [letter.raw_sha256 for letter in letters] == [hashlib.sha256(fuzzed.raw).hexdigest()]


@pytest.mark.timeout(PURE_TIMEOUT)
@FUZZ
@given(st.randoms(use_true_random=False))
def test_a_context_token_verifies_or_is_unauthenticated(rng: random.Random) -> None:
    token = token_variant(rng, KEYS)
    try:
        actor = verify_context_token(token, KEYS)
    except Unauthenticated:
        return
    assert actor.tenant.startswith("tenant-")
    assert actor.sub.startswith("agent-")


@pytest.mark.timeout(PURE_TIMEOUT)
@FUZZ
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_are_dead_lettered_or_answered(raw: bytes) -> None:
    emits = on_proposed(
        raw, source=SOURCE, catalog=catalog, limits=Limits(), now=NOW, trace_id=None
    )
    assert emits
    assert all(isinstance(e.value, DeadLetter | Outcome | ValidatedCall) for e in emits)
