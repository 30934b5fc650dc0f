"""Forged floods count (issue 45): a call whose context token does not verify draws from
buckets of its own (per claimed tenant, and all such calls together), is refused
``rate_limited`` with ``retry_after`` once they are empty, and never spends a verified
tenant's tokens. The pure parts, and the validator's handler with an in-memory limiter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from commands.catalog import Catalog
from commands.limits import (
    NO_LIMITS,
    UNVERIFIED_FLEET_KEY,
    CallScope,
    LimitSet,
    Unverified,
    buckets_of,
)
from commands.policy import PolicySet
from commands.reference import catalog as reference_catalog
from commands.validate import Limits
from config.settings import Admission as AdmissionSettings
from schemas.envelopes import Effect, Outcome, Status, ValidatedCall
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.admission import Admission, Proposal, refused, unverified_scope_of
from streams.emit import Emit
from streams.limiter import ADMITTED, UNVERIFIED_MARK, Ask, Verdict, script_arguments
from streams.stateless import validator_handler
from tests.unit.conftest import KEYS, token
from tests.unit.test_admission import LIMITS, NOW, _consumed, _Feed, _proposed
from tests.unit.test_stages import validated

UNVERIFIED = Unverified(rate=20, burst=50, fleet_rate=200, fleet_burst=400)


def _forged(tenant: str = "tenant-a") -> str:
    """A context token claiming ``tenant`` whose signature does not verify."""
    head, payload, signature = token(tenant=tenant).split(".")
    return f"{head}.{payload}.{signature[::-1]}"


class BucketLimiter:
    """Room per bucket key (absent: unlimited); a call is admitted when every bucket it draws
    from has room, and then spends one of each, as admit.lua does."""

    def __init__(self, room: dict[str, int]) -> None:
        self.room = dict(room)
        self.asked: list[Ask] = []

    async def admit(self, asks: Sequence[Ask]) -> list[Verdict]:
        self.asked += asks
        out = []
        for ask in asks:
            keys = [b.key for b in ask.buckets]
            if all(self.room.get(k, 1) > 0 for k in keys):
                for k in keys:
                    if k in self.room:
                        self.room[k] -= 1
                out.append(ADMITTED)
            else:
                out.append(Verdict(admitted=False, retry_after=0.05, reason="limit"))
        return out


def _admission(limits: LimitSet, room: dict[str, int]) -> tuple[Admission, BucketLimiter]:
    limiter = BucketLimiter(room)
    admission = Admission(
        limiter=limiter,  # type: ignore[arg-type]
        catalog=reference_catalog,
        keys=KEYS,
        limits=lambda: limits,
        unverified=UNVERIFIED,
    )
    return admission, limiter


def test_an_unverified_call_s_buckets_are_apart_from_every_verified_tenant_s() -> None:
    forged = UNVERIFIED.buckets("tenant-a")
    assert [b.key for b in forged] == ["unverified:tenant:tenant-a", UNVERIFIED_FLEET_KEY]
    assert [(b.rate, b.capacity) for b in forged] == [(20, 50), (200, 400)]
    verified = CallScope(
        call_id="c-1", tenant="tenant-a", agent="agent-1", tool="get_payment", effect=Effect.READ
    )
    assert not {b.key for b in forged} & {b.key for b in buckets_of(LIMITS, verified)}


def test_an_unverified_scope_names_the_claimed_tenant_and_its_outcome_names_none(
    catalog: Catalog,
) -> None:
    proposal = Proposal(
        call_id="c-1", tool="get_payment", context=_forged("tenant-b"), trace_id=None, reply_to=None
    )
    scope = unverified_scope_of(proposal, catalog)
    assert scope is not None and (scope.tenant, scope.verified) == ("tenant-b", False)
    garbage = Proposal(
        call_id="c-2", tool="get_payment", context="not-a-token", trace_id=None, reply_to=None
    )
    assert (unverified_scope_of(garbage, catalog) or scope).tenant == ""
    outcome = refused(
        proposal,
        scope,
        Verdict(admitted=False, retry_after=0.5, reason="limit"),
        now=NOW,
        policy_version=None,
    ).value
    assert isinstance(outcome, Outcome) and outcome.tenant is None
    assert outcome.error is not None and outcome.error.code is ErrorCode.RATE_LIMITED


def test_a_forged_call_s_decision_mark_is_not_a_verified_call_s() -> None:
    def ask(verified: bool) -> Ask:
        scope = CallScope(
            call_id="c-1",
            tenant="tenant-a",
            agent="agent-1",
            tool="get_payment",
            effect=Effect.READ,
            verified=verified,
        )
        return Ask(call=scope, buckets=UNVERIFIED.buckets("tenant-a"))

    settings = AdmissionSettings()
    _, argv = script_arguments([ask(True), ask(False)], prefix="p.", settings=settings)
    assert argv[-1] == f"c-1 {UNVERIFIED_MARK}c-1"


async def test_a_forged_flood_is_refused_from_its_own_buckets(
    catalog: Catalog, policies: PolicySet
) -> None:
    # No limits declared: forged calls are judged all the same.
    admission, limiter = _admission(NO_LIMITS, {"unverified:tenant:tenant-a": 2})
    handle = validator_handler(
        catalog=catalog,
        limits=Limits(),
        feed=_Feed(policies),  # type: ignore[arg-type]
        admission=admission,
    )
    forged = [_consumed(_proposed(call_id=f"f-{i}", context=_forged()), i) for i in range(5)]
    real = _consumed(_proposed(call_id="v-1"), 5)
    handled = await handle([*forged, real])
    kinds: list[Any] = []
    for h in handled:
        value = h.emits[-1].value
        kinds.append(
            value.error.code if isinstance(value, Outcome) and value.error else type(value)
        )
    # Two forged calls pass on (the authorizer refuses them unauthenticated), three are
    # refused here; the verified call draws nothing from the forged calls' buckets.
    assert kinds == [ValidatedCall] * 2 + [ErrorCode.RATE_LIMITED] * 3 + [ValidatedCall]
    for h in handled[2:5]:
        refusal = h.emits[0].value
        assert isinstance(refusal, Outcome) and refusal.tenant is None
        assert refusal.status is Status.REJECTED and refusal.error is not None
        assert refusal.error.retryable and (refusal.error.retry_after or 0) > 0
    drawn = {a.call.call_id: [b.key for b in a.buckets] for a in limiter.asked}
    assert drawn["v-1"] == []  # no limits declared for tenant-a
    assert all(drawn[f"f-{i}"] == [b.key for b in UNVERIFIED.buckets("tenant-a")] for i in range(5))


async def test_a_forged_flood_claiming_tenant_b_spends_none_of_b_s_tokens() -> None:
    limits = LimitSet.model_validate({"limits": [{"scope": "tenant", "rate": 200, "burst": 3}]})
    admission, limiter = _admission(limits, {"tenant:tenant-b": 3, "unverified:tenant:tenant-b": 1})
    forged = [
        ValidatedCall.model_validate(
            {**_validated_b(f"f-{i}").model_dump(), "context": _forged("tenant-b")}
        )
        for i in range(10)
    ]
    real = [_validated_b(f"v-{i}") for i in range(3)]
    out = await admission.admit(
        [(Emit(topic=Topic.VALIDATED, key=c.call_id, value=c),) for c in [*forged, *real]],
        now=NOW,
        policy_version=None,
    )
    admitted = [type(e[0].value) is ValidatedCall for e in out]
    assert admitted == [True] + [False] * 9 + [True] * 3
    assert limiter.room["tenant:tenant-b"] == 0  # B's three calls had B's three tokens


def _validated_b(call_id: str) -> ValidatedCall:
    return validated(tenant="tenant-b", call_id=call_id)
