"""A broker restart under load (issue 17, point 3), on a private broker (the shared one is never
touched): calls keep coming while the broker is killed with SIGKILL and restarted 10 s later.
Every call ends with one final outcome, and afterwards no consumer group's committed offset
is behind what it processed: no partition stops committing, nothing is replayed on the next
restart."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiokafka.errors import KafkaError

from config.settings import Settings
from runtime.clients import kafka_consumer, kafka_producer
from schemas.names import Topic
from tests.e2e.conftest import SigningKeys, start_pipeline
from tests.e2e.private_services import PrivateKafka, kafka_jars, private_kafka, required
from tests.services import (
    PIPELINE_INPUTS,
    commit_lag,
    context_token,
    keyed_call,
    run,
    where_calls_are,
)

RATE = 20  # calls per second
LOAD_SECONDS = 30
KILL_AT, RESTART_AT = 8.0, 18.0  # seconds into the load


async def load(settings: Settings, kafka: PrivateKafka, sent: dict[str, float]) -> None:
    """Publish reads at RATE for LOAD_SECONDS while the broker is killed and restarted. A
    call the broker did not acknowledge is sent again with the same call id (as an agent
    would)."""
    ctx = context_token(settings)
    producer = kafka_producer(settings, request_timeout_ms=15_000)
    await producer.start()

    async def bounce() -> None:
        await asyncio.sleep(KILL_AT)
        kafka.kill()
        await asyncio.sleep(RESTART_AT - KILL_AT)
        await asyncio.to_thread(kafka.start)

    async def deliver(call_id: str) -> None:
        body = keyed_call(call_id, "get_payment", {"payment_id": "pay_A1001"}, call_id, ctx)
        for _attempt in range(6):
            try:
                await asyncio.wait_for(
                    producer.send_and_wait(
                        settings.topic(Topic.PROPOSED), key=call_id.encode(), value=body
                    ),
                    timeout=20,
                )
            except (KafkaError, TimeoutError):
                continue
            sent[call_id] = time.monotonic()
            return

    bouncer = asyncio.create_task(bounce())
    start = time.monotonic()
    deliveries = []
    try:
        n = 0
        while time.monotonic() - start < LOAD_SECONDS:
            deliveries.append(
                asyncio.create_task(deliver(f"bounce-{n:05d}-{uuid.uuid4().hex[:6]}"))
            )
            n += 1
            await asyncio.sleep(1 / RATE)
        await bouncer
        await asyncio.gather(*deliveries)
        assert len(sent) == n, f"{n - len(sent)} of {n} calls never acknowledged by the broker"
    finally:
        await producer.stop()


async def final_outcomes(settings: Settings, calls: set[str], timeout: float) -> dict[str, int]:
    """Final outcomes per call id, read until every call in ``calls`` has one."""
    consumer = kafka_consumer(settings, settings.topic(Topic.OUTCOMES), group=None)
    await consumer.start()
    final: dict[str, int] = {}
    statuses: dict[str, str] = {}
    try:
        deadline = time.monotonic() + timeout
        while not calls <= final.keys() and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for record in batch:
                    body = json.loads(record.value)
                    if body["status"] != "awaiting_approval":
                        final[body["call_id"]] = final.get(body["call_id"], 0) + 1
                        statuses[body["call_id"]] = body["status"]
        assert {statuses[c] for c in calls if c in statuses} <= {"succeeded"}, statuses
        return final
    finally:
        await consumer.stop()


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_broker_restart_under_load_loses_nothing_and_leaves_no_offset_behind(
    signing_keys: SigningKeys,
) -> None:
    required(kafka_jars(), "the Kafka jars and java for a private broker")
    with private_kafka() as kafka:
        pipeline = start_pipeline(
            signing_keys,
            f"bounce-{uuid.uuid4().hex[:4]}",
            kafka_bootstrap=kafka.bootstrap,
        )
        settings = pipeline.settings
        try:
            sent: dict[str, float] = {}
            run(load(settings, kafka, sent))

            final = run(final_outcomes(settings, set(sent), timeout=180))
            lost = sorted(set(sent) - final.keys())
            if lost:
                # Where each lost call stopped, and the groups' positions, for the diagnosis.
                where = run(where_calls_are(settings, set(lost[:10])))
                behind = run(commit_lag(settings, PIPELINE_INPUTS, timeout=1))
                logs = "\n".join(f"{w.log_path}:\n{w.log_tail(60)}" for w in pipeline.workers)
                pytest.fail(
                    f"{len(lost)} of {len(sent)} calls never answered: {lost[:10]}\n"
                    f"where they are: {where}\ncommit lag: {behind}\nworker logs:\n{logs}"
                )
            assert pipeline.alive(), [w.log_tail() for w in pipeline.workers]

            behind = run(commit_lag(settings, PIPELINE_INPUTS, timeout=60))
            assert not behind, f"committed offsets behind the processed position: {behind}"
        finally:
            pipeline.stop()
