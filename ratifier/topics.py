"""Create every pipeline topic with the configured partition count (idempotent)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from runtime.clients import kafka_admin, kafka_security, start_kafka_client
from schemas.names import COMPACTED_TOPICS, Topic
from schemas.settings import KafkaConnection, Settings

# A reply topic holds copies of outcomes an agent reads within seconds: a short retention.
REPLY_RETENTION_MS = 60 * 60 * 1000


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
        for topic in Topic:
            name = settings.topic(topic)
            if name in existing:
                continue
            # Every topic takes records up to the size every producer may send and every
            # consumer fetches (docs/reliability.md, "Limits").
            configs = {"max.message.bytes": str(settings.limits.kafka_max_message_bytes)}
            if topic in COMPACTED_TOPICS:
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


async def ensure_reply_topic(
    connection: KafkaConnection,
    name: str,
    *,
    partitions: int = 1,
    retention_ms: int = REPLY_RETENTION_MS,
    max_message_bytes: int = 1_048_588,
    replication_factor: int = 1,
) -> bool:
    """Create an agent's reply topic (v1.3) when it is missing; True when created now. It
    takes records as large as every pipeline topic (``max.message.bytes``) and keeps them
    briefly (``retention.ms``): its outcomes are on `outcomes` for good."""
    admin = AIOKafkaAdminClient(**kafka_security(connection), client_id="ratifier-reply-topic")
    await start_kafka_client(admin, connection)
    try:
        if name in set(await admin.list_topics()):
            return False
        response = await admin.create_topics(
            [
                NewTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs={
                        "max.message.bytes": str(max_message_bytes),
                        "retention.ms": str(retention_ms),
                    },
                )
            ]
        )
        for _name, code, *_rest in getattr(response, "topic_errors", []):
            if code == 36:  # TOPIC_ALREADY_EXISTS: a concurrent creator won
                return False
            if code != 0:
                raise RuntimeError(f"creating reply topic {_name} failed with Kafka error {code}")
        return True
    finally:
        await admin.close()


async def delete_reply_topic(connection: KafkaConnection, name: str) -> None:
    """Delete an agent's reply topic (a client that created it for itself, on close)."""
    admin = AIOKafkaAdminClient(**kafka_security(connection), client_id="ratifier-reply-topic")
    await start_kafka_client(admin, connection)
    try:
        if name in set(await admin.list_topics()):
            await admin.delete_topics([name])
    finally:
        await admin.close()
