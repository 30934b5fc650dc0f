"""The `calls.proposed` key (contract v1.6): a tenant's lane read from the context token
without verifying it, stable per call; the call id when no tenant can be read."""

from __future__ import annotations

from collections import Counter

from aiokafka.partitioner import murmur2

from config.settings import Settings
from runtime.identity import context_keys, issue_context_token
from schemas.lanes import PROPOSAL_LANES, lane_of, proposal_key, tenant_claim

SETTINGS = Settings(development_mode=True)


def _token(tenant: str) -> str:
    return issue_context_token(context_keys(SETTINGS), sub="agent-1", tenant=tenant)


def test_a_call_is_keyed_by_its_tenants_lane_and_keeps_it() -> None:
    token = _token("tenant-a")
    assert tenant_claim(token) == "tenant-a"
    keys = Counter(proposal_key(token, call_id=f"call-{i}") for i in range(400))
    # Every lane of the tenant is used, and only those.
    assert set(keys) == {f"tenant-a#{lane}" for lane in range(PROPOSAL_LANES)}
    assert min(keys.values()) > 100
    # A retried record keeps its key (the lane is a function of the call id).
    assert proposal_key(token, call_id="call-7") == proposal_key(token, call_id="call-7")
    assert lane_of("call-7", 1) == 0


def test_an_unreadable_token_falls_back_to_the_call_id() -> None:
    for context in (
        "",
        "not-a-token",
        "a.b.c",
        "a.!!!.c",
        "a.bnVsbA.c",
        "x." + "A" * 20_000 + ".y",
    ):
        assert tenant_claim(context) is None
        assert proposal_key(context, call_id="call-1") == "call-1"
    # A forged tenant only routes the call (the validator and authorizer verify the token).
    forged = _token("tenant-b").split(".")
    assert tenant_claim(".".join([forged[0], forged[1], "bad-signature"])) == "tenant-b"


def test_the_e2e_tenants_do_not_share_partitions() -> None:
    """The flood test (tests/e2e/test_admission.py) relies on it at 4 and 12 partitions."""
    for partitions in (4, 12):
        lanes = {
            tenant: {
                (murmur2(f"{tenant}#{lane}".encode()) & 0x7FFFFFFF) % partitions
                for lane in range(PROPOSAL_LANES)
            }
            for tenant in ("tenant-a", "tenant-b")
        }
        assert not lanes["tenant-a"] & lanes["tenant-b"], (partitions, lanes)


def test_a_validated_call_keeps_its_proposal_s_lane_and_nothing_else() -> None:
    """calls.validated (v1.7): the proposal's key when it is the call's tenant lane; the call
    id for a proposal keyed by call id (up to v1.5) or by any other key."""
    from schemas.lanes import validated_key

    token = _token("tenant-a")
    lane = proposal_key(token, call_id="call-7")
    assert validated_key(lane, call_id="call-7", context=token) == lane
    assert validated_key("call-7", call_id="call-7", context=token) == "call-7"
    assert validated_key(None, call_id="call-7", context=token) == "call-7"
    # Another tenant's lane, another lane of the tenant, a key that is no lane: the call id.
    other_lane = f"tenant-a#{1 - lane_of('call-7')}"
    for key in ("tenant-b#0", other_lane, "anything", "#"):
        assert validated_key(key, call_id="call-7", context=token) == "call-7"
    assert validated_key(lane, call_id="call-7", context="not-a-token") == "call-7"
