"""An agent's own reply topic (contract v1.3): created when a client names one of its own,
deleted when it closes."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ratifier_client.kafka import kafka_security, start_kafka_client
from schemas.connection import KafkaConnection

# A reply topic holds copies of outcomes an agent reads within seconds: a short retention.
REPLY_RETENTION_MS = 60 * 60 * 1000


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
