"""The fetch pacing of the pipeline loops (runtime/clients.py, prompt_fetches) on aiokafka's
real fetcher, against a real broker: the parts it changes exist with the meaning it relies
on in the pinned release, and a release it was not tested with is left alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiokafka
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from config.settings import Settings
from runtime import clients
from runtime.clients import (
    FETCH_MAX_WAIT_MS,
    FETCHER_WAKE_MS,
    HELD_FETCH_WAIT_MS,
    kafka_consumer,
    prompt_fetches,
)
from schemas.names import Topic
from tests.services import publish

pytestmark = pytest.mark.integration


@pytest.fixture
async def held(settings: Settings, topics: list[str]) -> AsyncIterator[AIOKafkaConsumer]:
    """A started consumer of `calls.authorized` holding fetched records of partition 0."""
    del topics  # created
    name = settings.topic(Topic.AUTHORIZED)
    await publish(settings, [("held", b"1"), ("held", b"2"), ("held", b"3")], Topic.AUTHORIZED)
    consumer = kafka_consumer(settings, group=None)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(name, p) for p in range(settings.topic_partitions)])
        await consumer.seek_to_beginning()
        yield consumer
    finally:
        await consumer.stop()


async def take_one(consumer: AIOKafkaConsumer) -> TopicPartition:
    """One record, the rest of its fetch left in the fetcher (held); its partition."""
    while True:
        got = await consumer.getmany(timeout_ms=5000, max_records=1)
        for tp, records in got.items():
            if records:
                return tp


async def test_the_real_fetcher_is_paced_as_prompt_fetches_says(
    held: AIOKafkaConsumer,
) -> None:
    consumer = held
    assert aiokafka.__version__ in clients.PACED_AIOKAFKA
    assert prompt_fetches(consumer) is True
    fetcher = consumer._fetcher
    assert fetcher._prefetch_backoff == 0
    assert fetcher._fetcher_timeout == FETCHER_WAKE_MS / 1000
    tp = await take_one(consumer)
    # Records of ``tp`` are held: aiokafka's own backoff for them is none now (it waited
    # 100 ms before fetching any other partition of that broker).
    assert tp in fetcher._records
    assert fetcher._records[tp].calculate_backoff() == 0
    assignment = consumer._subscription.subscription.assignment
    fetcher._get_actions_per_node(assignment)
    assert fetcher._fetch_max_wait_ms == HELD_FETCH_WAIT_MS
    while tp in fetcher._records:  # take the rest
        await consumer.getmany(tp, timeout_ms=100)
    fetcher._get_actions_per_node(assignment)
    assert fetcher._fetch_max_wait_ms == FETCH_MAX_WAIT_MS


async def test_an_untested_aiokafka_keeps_its_pacing(
    held: AIOKafkaConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "PACED_AIOKAFKA", frozenset({"0.0.0"}))
    consumer = held
    assert prompt_fetches(consumer) is False
    fetcher = consumer._fetcher
    assert fetcher._prefetch_backoff > 0
    tp = await take_one(consumer)
    assert fetcher._records[tp].calculate_backoff() > 0  # aiokafka's own 100 ms
