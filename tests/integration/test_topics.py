from __future__ import annotations

import pytest

from ratifier.topics import ensure_topics
from runtime.clients import kafka_admin
from schemas.names import Topic
from schemas.settings import Settings

pytestmark = pytest.mark.integration


async def test_topics_created_once_with_configured_partitions(
    settings: Settings, topics: list[str]
) -> None:
    assert sorted(topics) == sorted(settings.topic(t) for t in Topic)
    assert await ensure_topics(settings) == []
    admin = kafka_admin(settings)
    await admin.start()
    try:
        described = await admin.describe_topics([settings.topic(t) for t in Topic])
    finally:
        await admin.close()
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    assert set(partitions.values()) == {settings.topic_partitions}
