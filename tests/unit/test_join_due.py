"""The approval-join's timer finds a state by its due time (streams/join_store.py's
``due_at``, the indexed column): a state is due exactly when the pure ``due`` says so, for
every phase."""

from __future__ import annotations

from datetime import timedelta

from approvals.signing import verify_decision
from commands.catalog import Catalog
from schemas.envelopes import ApprovalVerdict
from streams.approval import ApprovalState, Phase, due, on_decided, on_tick
from streams.join_store import due_at, lock_key
from tests.unit.conftest import NOW, SIGNING
from tests.unit.test_approval import RULES, authorized, decide, decision, pending


def states(catalog: Catalog) -> list[ApprovalState]:
    waiting = pending(catalog)
    approved = decide(catalog, waiting, decision(authorized())).state
    rejected = decide(catalog, waiting, decision(authorized(), ApprovalVerdict.REJECT)).state
    expired = on_tick(waiting, now=NOW + timedelta(hours=2), rules=RULES).state
    early = decision(authorized("c-held"))
    held = on_decided(
        None,
        early,
        verify_decision(early, kafka_key="c-held", keys=SIGNING, now=NOW),
        call_id="c-held",
        tool=None,
        now=NOW,
        rules=RULES,
    ).state
    found = [waiting, approved, rejected, expired, held]
    assert all(s is not None for s in found)
    return [s for s in found if s is not None]


def test_a_state_is_due_exactly_from_its_due_time(catalog: Catalog) -> None:
    found = states(catalog)
    assert {s.phase for s in found} == {
        Phase.PENDING,
        Phase.COMMITTED,
        Phase.REJECTED,
        Phase.EXPIRED,
        Phase.HELD,
    }
    for state in found:
        at = due_at(state)
        assert at is not None, state.phase
        for moment in (at - timedelta(microseconds=1), at, at + timedelta(hours=1)):
            assert due(state, moment) == (moment >= at), (state.phase, moment)


def test_lock_keys_are_per_deployment_and_call() -> None:
    assert lock_key("a.", "c-1") == lock_key("a.", "c-1")
    assert len({lock_key(d, c) for d in ("a.", "b.") for c in ("c-1", "c-2")}) == 4
    assert all(-(2**63) <= lock_key("a.", f"c-{n}") < 2**63 for n in range(100))
