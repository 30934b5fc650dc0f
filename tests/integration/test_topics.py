from __future__ import annotations

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from config.settings import Settings
from ratifier.topics import approvals_changelog, ensure_topics
from runtime.clients import kafka_admin
from schemas.names import COMPACTED_TOPICS, Topic

pytestmark = pytest.mark.integration


async def test_topics_created_once_with_configured_partitions(
    settings: Settings, topics: list[str]
) -> None:
    names = [settings.topic(t) for t in Topic]
    assert sorted(topics) == sorted(names)
    # The faust join's changelog is no longer made (issue 44), nor its expiry ticks' topic.
    assert approvals_changelog(settings) not in topics
    assert not [n for n in topics if n.endswith("approvals.timers")]
    assert await ensure_topics(settings) == []
    admin = kafka_admin(settings)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
        wanted = {"max.message.bytes": None, "cleanup.policy": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, name, wanted) for name in names]
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
    size = str(settings.limits.kafka_max_message_bytes)
    compacted = {settings.topic(t) for t in COMPACTED_TOPICS}
    assert limits == {
        name: {
            "max.message.bytes": size,
            "cleanup.policy": "compact" if name in compacted else "delete",
        }
        for name in names
    }
    # The faust join's changelog, as faust named it (read by `ratifier migrate-approvals`).
    assert approvals_changelog(settings).endswith(".ratifier-streams-approvals-changelog")
