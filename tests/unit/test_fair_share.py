"""Fair admission by default (issue 45, streams/fair_share.py): the pure rule (who is heavy,
how much of a heavy tenant's calls is admitted), one worker's shedder, and the admission step
with it; the Lua side runs on real Redis in tests/integration/test_fair_share.py."""

from __future__ import annotations

import pytest

from commands.catalog import Catalog
from commands.limits import NO_LIMITS
from config.settings import Admission as AdmissionSettings
from schemas.envelopes import Outcome, ValidatedCall
from schemas.errors import ErrorCode
from streams.fair_share import (
    OPEN,
    FairShare,
    FairShedder,
    Usage,
    heavy_tenants,
    next_share,
    parse_view,
    water_level,
)
from tests.unit.test_admission import NOW, _admission, _validated

SETTINGS = AdmissionSettings(fair_target_seconds=0.025, fair_tick_seconds=0.025)


def _usage(**judged: float) -> dict[str, Usage]:
    """Every tenant's calls all admitted (the onset of a queue: nothing shed yet)."""
    return {t.replace("_", "-"): Usage(judged=r, admitted=r) for t, r in judged.items()}


def test_the_water_level_serves_small_demands_in_full_and_splits_the_rest() -> None:
    assert water_level([4, 8000], 6000) == 5996
    assert water_level([1000, 2000, 3000], 5500) == 2500
    assert water_level([100, 100], 1000) == float("inf")
    assert water_level([3000, 3000, 3000], 3000) == 1000


def test_the_flooding_tenant_is_heavy_and_the_quiet_one_is_not() -> None:
    assert heavy_tenants(_usage(tenant_a=8000, tenant_b=4), active=1.0) == {"tenant-a"}
    # Two floods beside a quiet tenant: both heavy, the quiet one served in full.
    assert heavy_tenants(_usage(a=8000, c=8000, b=4), active=1.0) == {"a", "c"}
    # Equal tenants all over a queue: all heavy alike (each gets its equal share).
    assert heavy_tenants(_usage(a=1000, b=1000, c=1000), active=1.0) == {"a", "b", "c"}
    # Below the active rate a tenant does not count (here tenant-a is then alone).
    assert heavy_tenants(_usage(tenant_a=8000, tenant_b=0.5), active=1.0) == frozenset()


def test_a_tenant_alone_is_never_heavy() -> None:
    assert heavy_tenants(_usage(tenant_a=1e6), active=1.0) == frozenset()
    assert heavy_tenants({}, active=1.0) == frozenset()


def test_while_shedding_the_capacity_is_what_the_fleet_admitted() -> None:
    # The fleet admits 1,500/s while tenant-a asks 6,000 and tenant-b 1,000: 750 each is the
    # fair share, so tenant-b is above it too (half the demand, 3,500, would spare it).
    usage = {
        "tenant-a": Usage(judged=6000, admitted=500),
        "tenant-b": Usage(judged=1000, admitted=1000),
    }
    assert heavy_tenants(usage, active=1.0) == {"tenant-a", "tenant-b"}
    usage["tenant-b"] = Usage(judged=400, admitted=400)
    assert heavy_tenants(usage, active=1.0) == {"tenant-a"}


def test_the_admitted_fraction_halves_above_the_target_and_grows_back_below() -> None:
    usage = _usage(tenant_a=8000, tenant_b=4)
    above = next_share(OPEN, delay=0.030, usage=usage, settings=SETTINGS)
    assert above.heavy == {"tenant-a"} and above.admitting == 0.5 and above.shedding
    again = next_share(above, delay=0.030, usage=usage, settings=SETTINGS)
    assert again.admitting == 0.25
    # Four times the target: nothing of a heavy tenant at once.
    assert next_share(OPEN, delay=0.100, usage=usage, settings=SETTINGS).admitting == 0.0
    below = next_share(again, delay=0.010, usage=usage, settings=SETTINGS)
    assert below.admitting == pytest.approx(0.25 + 0.025)  # 1 per second, a 25 ms tick
    full = FairShare(heavy=frozenset({"tenant-a"}), admitting=0.99, delay=0.0)
    assert next_share(full, delay=0.0, usage=usage, settings=SETTINGS).admitting == 1.0


def test_the_shedder_admits_its_fraction_of_a_heavy_tenant_in_turn() -> None:
    shedder = FairShedder(SETTINGS)
    shedder.update(FairShare(heavy=frozenset({"tenant-a"}), admitting=0.5, delay=0.03))
    decided = [shedder.admits("tenant-a") for _ in range(10)]
    assert decided.count(True) == 5 and decided.count(False) == 5
    assert all(shedder.admits("tenant-b") for _ in range(10))
    shedder.refused_after("tenant-b")  # a declared limit refused one of those
    assert shedder.counted() == {"tenant-a": (10, 5), "tenant-b": (10, 9)}
    assert shedder.counted() == {}
    shedder.update(OPEN)
    assert all(shedder.admits("tenant-a") for _ in range(10))


def test_the_view_from_redis_parses_into_delay_and_usage() -> None:
    delay, usage = parse_view([b"37.5", b"tenant-a", b"8000", b"1200", b"tenant-b", b"4", b"4"])
    assert delay == pytest.approx(0.0375)
    assert usage == {
        "tenant-a": Usage(judged=8000, admitted=1200),
        "tenant-b": Usage(judged=4, admitted=4),
    }
    assert parse_view([b"0"]) == (0.0, {})


async def test_admission_sheds_a_heavy_tenant_with_retry_after(catalog: Catalog) -> None:
    admission, limiter = _admission(catalog, NO_LIMITS, room=0)
    fair = admission.fair = FairShedder(SETTINGS)
    fair.update(FairShare(heavy=frozenset({"tenant-a"}), admitting=0.0, delay=0.2))
    decided = [_validated("c-1"), _validated("c-2", tenant="tenant-b")]
    out = await admission.admit(decided, now=NOW, policy_version=None)
    refused = out[0][0].value
    assert isinstance(refused, Outcome) and refused.error is not None
    assert refused.error.code is ErrorCode.RATE_LIMITED and refused.error.retryable
    assert refused.error.retry_after == SETTINGS.shed_retry_after_seconds
    assert isinstance(out[1][0].value, ValidatedCall)
    assert fair.counted() == {"tenant-a": (1, 0), "tenant-b": (1, 1)}
    # Nothing shed for fairness draws on a declared limit's buckets.
    assert [a.call.call_id for a in limiter.asked] == ["c-2"]
