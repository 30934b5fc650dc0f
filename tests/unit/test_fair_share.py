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
    # Two floods beside two quiet tenants: both heavy, the quiet ones served in full.
    assert heavy_tenants(_usage(a=8000, c=8000, b=4, d=4), active=1.0) == {"a", "c"}
    # Two floods beside one quiet tenant: each floods half, not 1.5x its equal third, so
    # neither is heavy (a known limit: k floods alike among n tenants are heavy while
    # k < 2n/3).
    assert heavy_tenants(_usage(a=8000, c=8000, b=4), active=1.0) == frozenset()
    # Tenants calling alike are not one another's flood: none heavy, a little apart or not.
    assert heavy_tenants(_usage(a=1000, b=1000, c=1000), active=1.0) == frozenset()
    assert heavy_tenants(_usage(a=110, b=95, c=95), active=1.0) == frozenset()
    # Below the active rate a tenant does not count (here tenant-a is then alone).
    assert heavy_tenants(_usage(tenant_a=8000, tenant_b=0.5), active=1.0) == frozenset()


def test_a_tenant_alone_is_never_heavy() -> None:
    assert heavy_tenants(_usage(tenant_a=1e6), active=1.0) == frozenset()
    assert heavy_tenants({}, active=1.0) == frozenset()


def test_while_shedding_the_capacity_is_what_the_fleet_admitted() -> None:
    # The fleet admits 1,500/s while tenant-a asks 6,000, tenant-b 1,000 and tenant-c 1,000:
    # 500 each is the fair share; b and c are above it, but not heavier than their equal part
    # of the demand (1.5 x 2,667): only tenant-a is shed.
    usage = {
        "tenant-a": Usage(judged=6000, admitted=500),
        "tenant-b": Usage(judged=1000, admitted=500),
        "tenant-c": Usage(judged=1000, admitted=500),
    }
    assert heavy_tenants(usage, active=1.0) == {"tenant-a"}
    # Two floods beside them: both heavy (the level of 1,500 is 500; the equal part 3,500).
    usage["tenant-d"] = Usage(judged=6000, admitted=0)
    assert heavy_tenants(usage, active=1.0) == {"tenant-a", "tenant-d"}


def test_the_admitted_fraction_halves_above_the_target_and_grows_back_below() -> None:
    usage = _usage(tenant_a=8000, tenant_b=4)

    def tick(before: FairShare, delay: float, now: float) -> FairShare:
        return next_share(before, delay=delay, usage=usage, now=now, settings=SETTINGS)

    # Above the target: nothing shed until it has stayed above for the interval (50 ms).
    first = tick(OPEN, 0.030, now=10.0)
    assert first.heavy == {"tenant-a"} and first.admitting == 1.0 and not first.shedding
    assert tick(first, 0.030, now=10.025).admitting == 1.0
    above = tick(first, 0.030, now=10.075)
    assert above.admitting == 0.5 and above.shedding
    again = tick(above, 0.030, now=10.1)
    assert again.admitting == 0.25
    # Four times the target, once the interval is over: nothing of a heavy tenant.
    assert tick(tick(OPEN, 0.100, now=5.0), 0.100, now=5.075).admitting == 0.0
    # Below the target: grows back by 1 per second (a 25 ms tick), and the interval restarts.
    below = tick(again, 0.010, now=10.125)
    assert below.admitting == pytest.approx(0.25 + 0.025) and below.above_since is None
    # Above again while growing back: the same overload, shed at once (no new interval).
    assert tick(below, 0.030, now=10.15).admitting == pytest.approx(below.admitting / 2)
    full = FairShare(heavy=frozenset({"tenant-a"}), admitting=0.99, delay=0.0)
    assert tick(full, 0.0, now=11.0).admitting == 1.0


def test_a_burst_that_drains_within_the_interval_is_left_alone() -> None:
    usage = _usage(tenant_a=8000, tenant_b=4)
    share = OPEN
    # Above the target (25 ms), below an overload (100 ms), never for the whole interval.
    for n, delay in enumerate([0.03, 0.09, 0.01, 0.05, 0.099, 0.01, 0.06, 0.04, 0.01]):
        share = next_share(share, delay=delay, usage=usage, now=n * 0.025, settings=SETTINGS)
        assert share.admitting == 1.0


def test_an_overload_is_shed_at_once_without_waiting_out_the_interval() -> None:
    usage = _usage(tenant_a=8000, tenant_b=4)
    share = next_share(OPEN, delay=0.03, usage=usage, now=0.0, settings=SETTINGS)
    assert share.admitting == 1.0  # a burst, so far
    share = next_share(share, delay=0.1, usage=usage, now=0.025, settings=SETTINGS)
    assert share.shedding and share.admitting == 0.0  # 4x the target, half the interval


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
