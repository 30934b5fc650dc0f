from __future__ import annotations

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from config.settings import Settings
from ratifier.topics import ensure_topics
from runtime.clients import kafka_admin
from schemas.names import Topic

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
        wanted = {"max.message.bytes": None}
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, settings.topic(t), wanted) for t in Topic
        ]
        configs = await admin.describe_configs(resources)
    finally:
        await admin.close()
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    assert set(partitions.values()) == {settings.topic_partitions}
    # Every topic takes what every producer may send (docs/reliability.md, "Limits").
    limits = {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}
        for response in configs
        for resource in response.resources
    }
    expected = {"max.message.bytes": str(settings.limits.kafka_max_message_bytes)}
    assert limits == {settings.topic(t): expected for t in Topic}
