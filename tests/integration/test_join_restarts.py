"""The approval-join restarted 50 times while decisions are published (issue 44): real Kafka
and PostgreSQL, the join's service in this process (streams/join_service.py, in its shell).
Each restart stops the join (its batch finished, offsets committed), publishes one decision
(before the new join starts, while it starts, or once it is ready) and starts a new join.
Every approval ends once: one command per call, one request, one awaiting outcome."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from approvals.signing import approval_keys, sign_decision, statement_for
from commands.catalog import load_catalog
from config.settings import Settings
from feeds.policies import PolicyFeed, local_policies
from ratifier.topics import delete_topics, ensure_topics
from runtime.shell import ServiceShell
from schemas.envelopes import Actor, ApprovalVerdict, AuthorizedCall
from schemas.names import Topic
from streams.join_service import JoinService
from tests.services import publish, read_to_end, read_until, session_settings
from testsupport.records import authorized_refund

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPEATS = 50
BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))


@dataclass
class Running:
    service: JoinService
    shell: ServiceShell
    task: asyncio.Task[int]


@pytest.fixture
async def own() -> AsyncIterator[Settings]:
    settings = session_settings()
    await ensure_topics(settings)
    try:
        yield settings
    finally:
        await delete_topics(settings)


def start(settings: Settings) -> Running:
    catalog = load_catalog(settings.catalog)
    service = JoinService(settings, catalog, PolicyFeed(settings, local_policies(settings)))
    shell = service.shell(None, http_port=0)
    return Running(service, shell, asyncio.create_task(shell.run(service.consume)))


async def stop(running: Running) -> None:
    running.shell.shutdown()
    assert await asyncio.wait_for(running.task, timeout=30) == 0


async def ready(running: Running) -> None:
    owning = asyncio.create_task(running.service.owning.wait())
    await asyncio.wait({owning, running.task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    owning.cancel()
    assert running.service.owning.is_set(), "the join did not get its partitions"


def decision(settings: Settings, call: AuthorizedCall) -> tuple[str, bytes]:
    keys = approval_keys(settings)
    signed = sign_decision(
        statement_for(
            call_id=call.call_id,
            tenant=call.tenant,
            fingerprint=call.fingerprint,
            approver=BOSS,
            verdict=ApprovalVerdict.APPROVE,
            now=datetime.now(UTC),
            validity=keys.decision_validity,
        ),
        keys,
    )
    return call.call_id, signed.to_bytes()


def calls_on(records: list[object], topic: Topic) -> Counter[str]:
    return Counter(
        json.loads(r.value)["call_id"]  # type: ignore[attr-defined]
        for r in records
        if r.topic.endswith(topic.value)  # type: ignore[attr-defined]
    )


async def test_decisions_published_while_the_join_restarts_end_once(own: Settings) -> None:
    settings = own
    tag = uuid.uuid4().hex[:8]
    now = datetime.now(UTC)
    calls = [
        authorized_refund(
            f"jr-{tag}-{n}",
            {"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late"},
            now=now,
        )
        for n in range(REPEATS)
    ]
    ids = {c.call_id for c in calls}
    running = start(settings)
    await publish(settings, [(c.call_id, c.to_bytes()) for c in calls], Topic.AUTHORIZED)
    await read_until(
        settings,
        [Topic.APPROVALS_REQUESTED],
        lambda recs: set(calls_on(recs, Topic.APPROVALS_REQUESTED)) >= ids,
        timeout=60,
    )
    for n, call in enumerate(calls):
        await stop(running)
        moment = n % 3
        if moment == 0:  # before the new join starts
            await publish(settings, [decision(settings, call)], Topic.APPROVALS_DECIDED)
        running = start(settings)
        if moment == 1:  # while it starts (hooks, group join)
            await publish(settings, [decision(settings, call)], Topic.APPROVALS_DECIDED)
        await ready(running)
        if moment == 2:  # once it is ready
            await publish(settings, [decision(settings, call)], Topic.APPROVALS_DECIDED)
    try:
        await read_until(
            settings,
            [Topic.COMMITTED],
            lambda recs: set(calls_on(recs, Topic.COMMITTED)) >= ids,
            timeout=90,
        )
    finally:
        await stop(running)
    records = await read_to_end(
        settings, [Topic.COMMITTED, Topic.APPROVALS_REQUESTED, Topic.OUTCOMES]
    )
    assert calls_on(records, Topic.COMMITTED) == dict.fromkeys(ids, 1)
    assert calls_on(records, Topic.APPROVALS_REQUESTED) == dict.fromkeys(ids, 1)
    # Each call's one outcome from the join: awaiting_approval (the executor is not here).
    assert calls_on(records, Topic.OUTCOMES) == dict.fromkeys(ids, 1)
