"""Reply routing (v1.3) through the real pipeline: a client with a reply topic of its own gets
succeeded, rejected, denied and awaiting_approval → approved outcomes there, reading nothing
else; the outcomes are on `outcomes` too; a call naming a foreign reply topic is refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import TopicPartition

from ratifier_client.client import AwaitingApproval, Pending, RatifierClient
from schemas.envelopes import Outcome, Status
from schemas.errors import ErrorCode
from schemas.names import Topic
from tests.e2e.approvals_kit import REFUND, decide, token
from tests.e2e.conftest import Pipeline
from tests.services import (
    context_token,
    json_body,
    outcomes_by_call,
    proposal,
    publish,
    read_to_end,
    read_until,
    run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_a_client_with_a_reply_topic_reads_its_replies_only(pipeline: Pipeline) -> None:
    settings = pipeline.settings

    async def scenario() -> dict[str, Any]:
        async with RatifierClient.from_settings(settings, replies=True) as client:
            assert client.reply_to is not None
            reply_topic = client.reply_to.topic
            assert reply_topic.startswith(settings.reply_namespace)
            consumer = client._consumer
            assert consumer is not None
            assignment = consumer.assignment()
            ctx = context_token(settings)
            succeeded = await client.call(
                "get_payment", {"payment_id": "pay_A1001"}, context=ctx, within=60
            )
            rejected = await client.call(
                "get_payment", {"payment_id": "pay_A1001", "tenant_id": "x"}, context=ctx
            )
            denied = await client.call("get_payment", {"payment_id": "pay_B2001"}, context=ctx)
            handle = await client.submit(
                "propose_refund", REFUND, context=token(settings, "agent-1", roles=("refund",))
            )
            awaiting = await handle.approval(within=60)
            assert awaiting is not None and awaiting.request is not None
            request = awaiting.request.model_dump(mode="json")
            await asyncio.to_thread(decide, pipeline, request, token(settings, "boss"))
            approved = await handle.result(within=60)
            return {
                "topic": reply_topic,
                "assignment": assignment,
                "outcomes": (succeeded, rejected, denied, approved),
                "awaiting": awaiting,
                "fetched": client.records_fetched,
                "ids": [handle.call_id],
            }

    seen = run(scenario())
    assert seen["assignment"] == {TopicPartition(seen["topic"], 0)}
    succeeded, rejected, denied, approved = seen["outcomes"]
    assert isinstance(succeeded, Outcome) and succeeded.status is Status.SUCCEEDED
    assert isinstance(rejected, Outcome) and rejected.status is Status.REJECTED
    assert rejected.error is not None and rejected.error.code is ErrorCode.INVALID_ARGUMENTS
    assert isinstance(denied, Outcome) and denied.status is Status.DENIED
    assert denied.error is not None and denied.error.code is ErrorCode.NOT_FOUND
    awaiting: AwaitingApproval = seen["awaiting"]
    assert awaiting.outcome.status is Status.AWAITING_APPROVAL
    assert awaiting.preview and awaiting.expires_at is not None
    assert isinstance(approved, Outcome), approved
    assert approved.status is Status.SUCCEEDED
    assert approved.approval is not None
    # Its own records only: 5 outcomes and 1 approval request (repeats are possible:
    # at-least-once stages), nothing of any other call.
    assert 6 <= seen["fetched"] <= 12, seen["fetched"]
    # The outcomes are on `outcomes` too (dashboards, audit), with their reply address.
    ids = {o.call_id for o in seen["outcomes"]}
    records = run(
        read_until(
            settings,
            [Topic.OUTCOMES],
            lambda rs: ids <= set(outcomes_by_call(rs)),
        )
    )
    on_outcomes = outcomes_by_call(records)
    for call_id in ids:
        assert all(
            o["reply_to"] == {"topic": seen["topic"], "partition": None}
            for o in on_outcomes[call_id]
        )


def test_a_call_naming_a_foreign_reply_topic_is_refused(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    foreign = {"topic": settings.topic(Topic.COMMITTED)}
    call = proposal(
        settings, tool="get_payment", arguments={"payment_id": "pay_A1001"}, reply_to=foreign
    )
    run(publish(settings, [(call["call_id"], json.dumps(call).encode())]))
    records = run(
        read_until(settings, [Topic.OUTCOMES], lambda rs: call["call_id"] in outcomes_by_call(rs))
    )
    (refused, *_repeats) = outcomes_by_call(records)[call["call_id"]]
    assert refused["status"] == Status.REJECTED.value
    assert refused["error"]["code"] == ErrorCode.INVALID_REPLY_ADDRESS.value
    assert refused["error"]["fields"][0]["path"] == "$.reply_to.topic"
    assert refused["reply_to"] is None
    # Nothing of it reached the foreign topic (it carries committed commands only).
    committed = run(read_to_end(settings, [Topic.COMMITTED]))
    assert not any((json_body(r) or {}).get("call_id") == call["call_id"] for r in committed)


def test_pending_is_not_a_failure_with_a_reply_topic(pipeline: Pipeline) -> None:
    """A wait that ends first answers Pending (the reply topic changes nothing there)."""
    settings = pipeline.settings

    async def scenario() -> Outcome | Pending:
        async with RatifierClient.from_settings(settings, replies=True) as client:
            handle = await client.submit(
                "propose_refund", REFUND, context=token(settings, "agent-1", roles=("refund",))
            )
            await handle.approval(within=60)
            return await handle.result(within=0.5)

    waited = run(scenario())
    assert isinstance(waited, Pending)
    assert waited.status is Status.AWAITING_APPROVAL
