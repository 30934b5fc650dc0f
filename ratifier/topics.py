"""Create every pipeline topic with the configured partition count (idempotent)."""

from __future__ import annotations

from aiokafka.admin import NewTopic

from config.settings import Settings

# An agent's reply topic (v1.3) is the client's business: created and deleted by it.
from ratifier_client.topics import REPLY_RETENTION_MS as REPLY_RETENTION_MS
from ratifier_client.topics import delete_reply_topic as delete_reply_topic
from ratifier_client.topics import ensure_reply_topic as ensure_reply_topic
from runtime.clients import kafka_admin, start_kafka_client
from schemas.names import APPROVAL_TABLE, COMPACTED_TOPICS, STREAMS_APP_ID, Topic


async def ensure_topics(
    settings: Settings, *, replication_factor: int = 1, min_insync_replicas: int | None = None
) -> list[str]:
    """Create the missing topics; return the names created now. A replicated cluster asks for
    ``replication_factor=3, min_insync_replicas=2`` (deploy/local/kafka-cluster, the
    three-broker test): an `acks=all` write then survives the loss of one broker."""
    admin = kafka_admin(settings)
    await start_kafka_client(admin, settings.kafka)
    try:
        existing = set(await admin.list_topics())
        wanted = []
        compacted = {settings.topic(t) for t in COMPACTED_TOPICS}
        for name in [settings.topic(t) for t in Topic]:
            if name in existing:
                continue
            # Every topic takes records up to the size every producer may send and every
            # consumer fetches (docs/reliability.md, "Limits").
            configs = {"max.message.bytes": str(settings.limits.kafka_max_message_bytes)}
            if name in compacted:
                configs["cleanup.policy"] = "compact"
            if min_insync_replicas is not None:
                configs["min.insync.replicas"] = str(min_insync_replicas)
            wanted.append(
                NewTopic(
                    name=name,
                    num_partitions=settings.topic_partitions,
                    replication_factor=replication_factor,
                    topic_configs=configs,
                )
            )
        if wanted:
            response = await admin.create_topics(wanted)
            for _name, code, *_rest in getattr(response, "topic_errors", []):
                if code not in (0, 36):  # 36 = TOPIC_ALREADY_EXISTS: a concurrent creator won
                    raise RuntimeError(f"creating topic {_name} failed with Kafka error {code}")
        return [t.name for t in wanted]
    finally:
        await admin.close()


def approvals_changelog(settings: Settings) -> str:
    """The faust approval-join's table changelog (before issue 44), named as faust named it:
    no longer created; `ratifier migrate-approvals` reads it once on an upgrade, after which
    it may be deleted (docs/upgrading.md)."""
    return f"{settings.group(STREAMS_APP_ID)}-{APPROVAL_TABLE}-changelog"


async def delete_topics(settings: Settings) -> None:
    """Delete this prefix's topics (tests use a throw-away prefix)."""
    admin = kafka_admin(settings)
    await start_kafka_client(admin, settings.kafka)
    try:
        existing = set(await admin.list_topics())
        names = [n for n in existing if n.startswith(settings.topic_prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()
