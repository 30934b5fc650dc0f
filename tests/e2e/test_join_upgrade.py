"""Upgrading from the faust approval-join loses no pending approval (issue 44): requests
left pending by the previous version (its changelog topic, its committed offsets, the
requests and awaiting outcomes it published), `ratifier migrate-approvals`, the new join,
decisions: each refund runs once, nobody is asked twice.

The previous version is played by this test exactly as the faust join behaved: it consumed
`calls.authorized` in its group (`<prefix>ratifier-streams`), decided with the same pure
functions (streams/approval.py), published what they emitted, kept each state in its table —
whose changelog record is the call id (raw key) and the state's JSON (raw value), faust's
`raw` serializers — and committed its offsets."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from aiokafka.admin import NewTopic

from commands.catalog import load_catalog
from config.settings import Settings
from feeds.policies import PolicyFeed, local_policies
from ratifier.topics import approvals_changelog
from runtime.clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.envelopes import AuthorizedCall, SourcePosition
from schemas.names import STREAMS_APP_ID, Topic
from streams.join_decisions import ApprovalJoin
from streams.stages_service import limits_from
from tests.e2e.approvals_kit import decide, propose_only, token
from tests.e2e.conftest import Pipeline, SigningKeys
from tests.e2e.executor_kit import provider_stats
from tests.e2e.test_join_durability import by_call, ended, join_apart, start_join
from tests.services import read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


async def previous_version(settings: Settings, ids: set[str]) -> list[dict[str, object]]:
    """The faust join's work on ``ids``' authorized calls; the requests it published."""
    admin = kafka_admin(settings)
    await admin.start()
    try:
        changelog = approvals_changelog(settings)
        if changelog not in await admin.list_topics():
            await admin.create_topics(
                [
                    NewTopic(
                        name=changelog,
                        num_partitions=settings.topic_partitions,
                        replication_factor=1,
                        topic_configs={"cleanup.policy": "compact"},
                    )
                ]
            )
    finally:
        await admin.close()

    async def no_resource(*_args: object) -> None:
        return None

    catalog = load_catalog(settings.catalog)
    join = ApprovalJoin(
        settings,
        catalog=catalog,
        feed=PolicyFeed(settings, local_policies(settings)),
        fetch=no_resource,
        limits=limits_from(settings),
    )
    consumer = kafka_consumer(
        settings, settings.topic(Topic.AUTHORIZED), group=settings.group(STREAMS_APP_ID)
    )
    producer = kafka_producer(settings)
    await consumer.start()
    await producer.start()
    requests: list[dict[str, object]] = []
    try:
        seen: set[str] = set()
        while seen < ids:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    call = AuthorizedCall.model_validate_json(record.value or b"")
                    joined = await join.on_record(
                        Topic.AUTHORIZED,
                        record.key,
                        record.value,
                        SourcePosition(
                            topic=tp.topic, partition=tp.partition, offset=record.offset
                        ),
                        None,
                        now=datetime.now(UTC),
                    )
                    assert joined is not None and joined.state is not None
                    for step in joined.steps:
                        for emit in step.emits:
                            await producer.send_and_wait(
                                settings.topic(emit.topic),
                                key=(emit.key or "").encode(),
                                value=emit.value.to_bytes(),
                            )
                            if emit.topic is Topic.APPROVALS_REQUESTED:
                                requests.append(json.loads(emit.value.to_bytes()))
                    await producer.send_and_wait(
                        approvals_changelog(settings),
                        key=call.call_id.encode(),
                        value=joined.state.model_dump_json().encode(),
                    )
                    seen.add(call.call_id)
            await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()
    return requests


def migrate_approvals(pipeline: Pipeline) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ratifier.cli", "migrate-approvals"],
        env={**pipeline.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_pending_approvals_of_the_faust_join_survive_the_upgrade(
    signing_keys: SigningKeys,
) -> None:
    with join_apart(signing_keys, "join-upgrade") as pipeline:
        settings = pipeline.settings
        ids = set(propose_only(pipeline, 3, amount_minor=1))
        run(
            read_until(
                settings,
                [Topic.AUTHORIZED],
                lambda recs: ids <= {json.loads(r.value)["call_id"] for r in recs},
            )
        )
        requests = run(previous_version(settings, ids))
        assert {r["call_id"] for r in requests} == ids

        # The upgrade: the states into PostgreSQL, then the new join.
        assert "3 kept" in migrate_approvals(pipeline)
        start_join(pipeline, "join")
        boss = token(settings, "boss")
        for request in requests:
            decide(pipeline, request, boss)
        assert ended(pipeline, ids) == {c: ["succeeded"] for c in ids}
        stats = provider_stats(pipeline.provider_url)
        assert len(stats["by_key"]) == 3
        assert set(stats["by_key"].values()) == {1}
        records = run(read_to_end(settings, [Topic.COMMITTED, Topic.APPROVALS_REQUESTED]))
        assert {c: len(v) for c, v in by_call(records, Topic.COMMITTED).items()} == (
            dict.fromkeys(ids, 1)
        )
        # The new join asked nobody again: the previous version's requests are the only ones.
        assert {c: len(v) for c, v in by_call(records, Topic.APPROVALS_REQUESTED).items()} == (
            dict.fromkeys(ids, 1)
        )

        # Run again (every join stopped): what the table has is never overwritten.
        pipeline.stop_worker("join")
        assert "0 kept, 3 already there" in migrate_approvals(pipeline)
