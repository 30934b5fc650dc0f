"""Backpressure on real Kafka: the validator's lag probe measures the next stages' backlog
(records on their input topics their groups have not committed) and sheds above the bound."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import TopicPartition

from commands.limits import NO_LIMITS
from config.settings import Admission as AdmissionSettings
from config.settings import Settings
from ratifier.topics import delete_topics, ensure_topics
from runtime.clients import kafka_admin, kafka_consumer
from schemas.names import AUTHORIZER_GROUP, Topic
from streams.admission import Admission, downstream_lag, watch_lag
from tests.services import publish, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_settings(settings: Settings) -> Iterator[Settings]:
    own = settings.model_copy(
        update={
            "topic_prefix": f"g{uuid.uuid4().hex[:10]}.",
            "topic_partitions": 2,
            "admission": AdmissionSettings(
                shed_bulk_lag=50, shed_all_lag=500, lag_probe_seconds=0.2
            ),
        }
    )
    run(ensure_topics(own))
    yield own
    run(delete_topics(own))


async def test_lag_of_the_authorizer_group_turns_shedding_on(own_settings: Settings) -> None:
    topic = own_settings.topic(Topic.VALIDATED)
    group = kafka_consumer(own_settings, group=own_settings.group(AUTHORIZER_GROUP))
    await group.start()
    start = {TopicPartition(topic, p): 0 for p in range(2)}
    try:  # the authorizer's group has read nothing yet: its offsets are at the start
        group.assign(list(start))
        await group.commit(start)
    finally:
        await group.stop()
    await publish(own_settings, [(f"k-{i}", b"{}") for i in range(120)], topic=Topic.VALIDATED)

    admin, probe = kafka_admin(own_settings), kafka_consumer(own_settings, group=None)
    await admin.start()
    await probe.start()
    try:
        assert await downstream_lag(admin, probe, own_settings) == 120
    finally:
        await probe.stop()
        await admin.close()

    admission = Admission(limiter=None, catalog=None, keys=None, limits=lambda: NO_LIMITS)  # type: ignore[arg-type]
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_lag(own_settings, admission, stop))
    try:
        async with asyncio.timeout(20):
            while admission.shedding is None:  # noqa: ASYNC110 - the watcher sets a plain field
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await watcher
    assert admission.shedding is not None and admission.shedding.lag == 120
    assert admission.shedding.bulk_bound == 50 and admission.shedding.all_bound == 500
