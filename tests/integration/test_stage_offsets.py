"""Upgrading to the stateless stages on the runtime loop: their groups adopt the former faust
group's offsets once, and never overwrite offsets of their own."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition

from config.settings import Settings
from runtime.clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.names import STREAMS_APP_ID, VALIDATOR_GROUP, Topic
from schemas.vocabulary import StreamStage
from streams.stateless import SPECS, adopt_offsets

pytestmark = pytest.mark.integration

VALIDATOR = next(s for s in SPECS if s.name is StreamStage.VALIDATOR)


async def commit(settings: Settings, group: str, offsets: dict[int, int]) -> None:
    consumer = kafka_consumer(settings, group=settings.group(group))
    await consumer.start()
    try:
        tps = {TopicPartition(settings.topic(Topic.PROPOSED), p): o for p, o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()


async def offsets_of(settings: Settings, group: str) -> dict[int, int]:
    admin = kafka_admin(settings)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(settings.group(group))
    finally:
        await admin.close()
    topic = settings.topic(Topic.PROPOSED)
    return {tp.partition: meta.offset for tp, meta in found.items() if tp.topic == topic}


async def test_stage_group_adopts_the_faust_groups_offsets_once(
    settings: Settings, topics: list[str]
) -> None:
    producer = kafka_producer(settings)
    await producer.start()
    try:
        for partition in range(4):
            for _ in range(5):
                await producer.send_and_wait(
                    settings.topic(Topic.PROPOSED), b"{}", partition=partition
                )
    finally:
        await producer.stop()
    assert await offsets_of(settings, VALIDATOR_GROUP) == {}
    former = {0: 3, 1: 2, 2: 5, 3: 1}
    await commit(settings, STREAMS_APP_ID, former)
    await adopt_offsets(settings, VALIDATOR)
    assert await offsets_of(settings, VALIDATOR_GROUP) == former

    # The group has offsets of its own now: a second adoption leaves them alone.
    await commit(settings, VALIDATOR_GROUP, {1: 4})
    await commit(settings, STREAMS_APP_ID, {2: 0})
    await adopt_offsets(settings, VALIDATOR)
    assert await offsets_of(settings, VALIDATOR_GROUP) == {**former, 1: 4}


async def test_no_former_group_adopts_nothing(settings: Settings, topics: list[str]) -> None:
    fresh = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "fresh."})
    await adopt_offsets(fresh, VALIDATOR)
    assert await offsets_of(fresh, VALIDATOR_GROUP) == {}
