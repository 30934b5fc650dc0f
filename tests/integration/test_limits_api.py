"""Limits at run time on real Kafka and Redis: a policy set published with limits (as
`ratifier policy publish` does) reaches a running process's feed; the dashboard's
/api/limits shows the token's tenant the limits that apply to it and its live buckets only."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from commands.limits import CallScope, buckets_of, parse_limits
from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from config.settings import Settings
from feeds.policies import policy_record, publish_policies
from ratifier.limits import report
from runtime.clients import redis_client
from schemas.envelopes import Effect
from streams.limiter import Ask, FleetLimiter
from tests.services import bearer

pytestmark = pytest.mark.integration

LIMITS = parse_limits(
    {
        "limits": [
            {"scope": "tenant", "rate": 100},
            {"scope": "tenant", "tenant": "tenant-a", "rate": 5, "burst": 10},
            {"scope": "tenant", "tenant": "tenant-b", "rate": 7},
        ]
    },
    source="test",
)


async def test_published_limits_and_usage_are_shown_per_tenant(
    dashboard: Any, own_settings: Settings
) -> None:
    plain = PolicySet.from_directory(DEFAULT_POLICY_DIR)
    limited = PolicySet.from_sources(plain.text, plain.schema, limits=LIMITS)
    await publish_policies(own_settings, policy_record(own_settings, limited))
    redis = redis_client(own_settings)
    limiter = FleetLimiter(redis, own_settings.admission, prefix=own_settings.topic_prefix)
    call = CallScope(
        call_id=f"c-{uuid.uuid4().hex}",
        tenant="tenant-a",
        agent="a",
        tool="get_payment",
        effect=Effect.READ,
    )
    assert (await limiter.admit([Ask(call=call, buckets=buckets_of(LIMITS, call))]))[0].admitted
    await redis.aclose()

    assert (await dashboard.get("/api/limits")).status == 401
    response = await dashboard.get("/api/limits", headers=bearer(own_settings, "tenant-a"))
    assert response.status == 200
    body = await response.json()
    assert body["policy_version"] == limited.version  # the published set, not the folder's
    assert [(r.get("tenant"), r["rate"]) for r in body["limits"]] == [(None, 100), ("tenant-a", 5)]
    assert body["usage"] == [{"bucket": "tenant:tenant-a", "holds": "9.0 tokens left"}]
    other = await (
        await dashboard.get("/api/limits", headers=bearer(own_settings, "tenant-b"))
    ).json()
    assert other["usage"] == []  # another tenant's buckets are not shown

    lines = await report(own_settings, local=False, tenant="tenant-a")
    assert any("5/s burst 10" in line for line in lines), lines
    assert any("tenant:tenant-a" in line and "tokens left" in line for line in lines), lines
