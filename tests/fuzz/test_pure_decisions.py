"""Fuzzing the approval-join's pure decision path: whatever arrives on `approvals.decided`
for a pending call, only a valid signed approval of exactly that call commits it, once;
anything unreadable is dead-lettered with its digest and size and nothing else; nothing
raises."""

from __future__ import annotations

import hashlib
import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from approvals.signing import ApprovalKeys, local_signing_key, verify_decision
from commands.reference import catalog
from schemas.envelopes import ApprovalDecision, CommittedCommand, DeadLetter, SourcePosition
from streams.approval import Phase, Rules, decision_dead_letter, on_authorized, on_decided
from tests.fuzz.generate import decision_record
from tests.fuzz.scale import PURE_TIMEOUT
from tests.fuzz.test_pure_stages import FUZZ
from tests.unit.conftest import NOW, SIGNING
from testsupport.records import authorized_refund

RULES = Rules(keys=SIGNING, hold=timedelta(seconds=60), retention=timedelta(minutes=5))
SOURCE = SourcePosition(topic="approvals.decided", partition=0, offset=0)
ARGS = {"payment_id": "pay_A1001", "amount_minor": 4900, "reason": "charged twice"}
_OTHER = local_signing_key("someone-else-s-approval-signing-seed-long-enough")
WRONG = ApprovalKeys(
    signing_key=_OTHER,
    kid="unit-1",  # the service's kid, another key: the signature must not verify
    algorithm="EdDSA",
    service_keys={"unit-1": (_OTHER.public_key(), "EdDSA")},
)
TOOL = catalog.get("propose_refund")


@pytest.mark.timeout(PURE_TIMEOUT)
@FUZZ
@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=3))
def test_only_a_valid_approval_of_this_call_commits_it(rng: random.Random, count: int) -> None:
    call = authorized_refund(f"c-{rng.getrandbits(32):08x}", ARGS, now=NOW)
    opened = on_authorized(None, call, tool=TOOL, now=NOW, rules=RULES)
    state = opened.state
    assert state is not None and state.phase is Phase.PENDING
    now = NOW + timedelta(seconds=30)
    commits = 0
    ended = None  # the first decision that ended the approval: approve or reject
    for _ in range(count):  # a few decisions in a row about the same call
        fuzzed = decision_record(
            rng,
            call_id=call.call_id,
            tenant=call.tenant,
            fingerprint=call.fingerprint,
            requester=call.actor.sub,
            keys=SIGNING,
            wrong_keys=WRONG,
            now=now,
        )
        try:
            decision = ApprovalDecision.model_validate_json(fuzzed.raw)
        except (ValidationError, ValueError):
            assert not fuzzed.readable, fuzzed.kind
            letter = decision_dead_letter(
                fuzzed.raw, reason="unreadable", key=call.call_id, source=SOURCE, at=now
            ).value
            assert isinstance(letter, DeadLetter)
            assert letter.raw_sha256 == hashlib.sha256(fuzzed.raw).hexdigest()
            assert letter.raw_size == len(fuzzed.raw) and letter.raw_base64 == ""
            continue
        assert fuzzed.readable, fuzzed.kind
        verified = verify_decision(decision, kafka_key=call.call_id, keys=SIGNING, now=now)
        step = on_decided(
            state, decision, verified, call_id=call.call_id, tool=TOOL, now=now, rules=RULES
        )
        made = [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]
        if made:
            assert fuzzed.commits and ended is None, fuzzed.kind
            (command,) = made
            assert (command.call_id, command.fingerprint) == (call.call_id, call.fingerprint)
            assert command.approval is not None
        elif fuzzed.commits and ended is None:
            pytest.fail("a valid approval of a pending call did not commit it")
        if ended is None and (fuzzed.commits or fuzzed.rejects):
            ended = fuzzed.kind
        commits += len(made)
        if not fuzzed.commits and not fuzzed.rejects and ended is None:
            # A refused decision changes nothing: the call still waits.
            assert step.state is not None and step.state.phase is Phase.PENDING, fuzzed.kind
        state = step.state
    assert commits <= 1
