"""`ratifier policy status` against real Kafka: the published set in force, where it came
from, and whether the local folder differs."""

from __future__ import annotations

import pytest

from commands.policy import PolicySet
from commands.policy_feed import local_policies, policy_record, policy_status, publish_policies
from ratifier.topics import ensure_topics
from schemas.settings import Settings

pytestmark = pytest.mark.integration


async def test_status_shows_the_published_set_and_the_local_drift(settings: Settings) -> None:
    await ensure_topics(settings)
    local = local_policies(settings)
    newer = PolicySet.from_sources(local.text + "\n// published later\n", local.schema)
    await publish_policies(settings, policy_record(settings, newer))
    status = await policy_status(settings)
    assert status.in_force == newer.version
    assert status.local == local.version
    assert status.differs
    assert status.origin.startswith(f"topic {settings.topic_prefix}policies key 'default'")
    assert "DIFFERS" in status.render()
    await publish_policies(settings, policy_record(settings, local))
    again = await policy_status(settings)
    assert again.in_force == local.version
    assert not again.differs
