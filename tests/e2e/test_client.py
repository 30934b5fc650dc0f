"""`ratifier_client.client` against the real pipeline: calls, approvals, pending waits, batches."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from ratifier_client.client import (
    AwaitingApproval,
    Pending,
    ProposedToolCall,
    RatifierClient,
    SyncRatifierClient,
    idempotency_key_for,
)
from schemas.envelopes import Outcome, Status
from schemas.errors import ErrorCode
from tests.e2e.approvals_kit import REFUND, decide, token
from tests.e2e.conftest import Pipeline
from tests.services import context_token, run

pytestmark = pytest.mark.e2e


def _client(pipeline: Pipeline) -> RatifierClient:
    return RatifierClient.from_settings(pipeline.settings)


def test_a_call_returns_its_terminal_outcome_in_its_trace(pipeline: Pipeline) -> None:
    async def scenario() -> tuple[Outcome | Pending, Outcome | Pending, int, int]:
        async with _client(pipeline) as client:
            parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
            read = await client.call(
                "get_payment",
                {"payment_id": "pay_A1001"},
                context=context_token(pipeline.settings),
                traceparent=parent,
                within=60,
            )
            refused = await client.call(
                "get_payment",
                {"payment_id": "pay_A1001", "tenant_id": "tenant-b"},
                context=context_token(pipeline.settings),
                within=60,
            )
            return read, refused, client.records_fetched, len(client.home_partitions)

    read, refused, fetched, homes = run(scenario())
    assert isinstance(read, Outcome)
    assert read.status is Status.SUCCEEDED
    assert read.result is not None
    assert read.result["id"] == "pay_A1001"
    assert read.trace_id == "ab" * 16
    assert isinstance(refused, Outcome)
    assert refused.status is Status.REJECTED
    assert refused.error is not None
    assert refused.error.code is ErrorCode.INVALID_ARGUMENTS
    # The client read only its home partition, not the whole outcomes topic.
    assert homes == 1
    assert fetched >= 2


def test_a_wait_that_ends_first_answers_pending_and_can_be_awaited_again(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings

    async def scenario() -> tuple[AwaitingApproval | None, Outcome | Pending, Outcome | Pending]:
        async with _client(pipeline) as client:
            handle = await client.submit(
                "propose_refund",
                REFUND,
                context=token(settings, "agent-1", roles=("refund",)),
                idempotency_key=idempotency_key_for(agent="agent-1", run=run_id(), step=1),
            )
            awaiting = await handle.approval(within=60)
            first = await handle.result(within=0.5)
            assert awaiting is not None and awaiting.request is not None
            request = awaiting.request.model_dump(mode="json")
            await asyncio.to_thread(decide, pipeline, request, token(settings, "boss"))
            second = await client.wait(handle.call_id, within=60)
            return awaiting, first, second

    awaiting, first, second = run(scenario())
    assert awaiting is not None
    assert awaiting.outcome.status is Status.AWAITING_APPROVAL
    assert awaiting.preview, "the approval's preview reaches the agent"
    assert awaiting.expires_at is not None
    assert isinstance(first, Pending)
    assert first.status is Status.AWAITING_APPROVAL
    assert isinstance(second, Outcome)
    assert second.status is Status.SUCCEEDED


def run_id() -> str:
    """Tests share one database: a run id of their own keeps their keys theirs."""
    return f"run-{uuid.uuid4().hex[:8]}"


def test_a_retried_step_reuses_its_key_and_gets_the_stored_outcome(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    key = idempotency_key_for(agent="agent-1", run=run_id(), step="lookup")

    async def scenario() -> list[Outcome | Pending]:
        async with _client(pipeline) as client:
            calls = [
                ProposedToolCall(
                    tool="get_payment",
                    arguments={"payment_id": "pay_A1002"},
                    context=context_token(settings),
                    idempotency_key=key,
                )
                for _ in range(2)
            ]
            handles = await client.submit_many(calls)
            assert len({h.call_id for h in handles}) == 2
            assert {h.idempotency_key for h in handles} == {key}
            return [await h.result(within=60) for h in handles]

    outcomes = run(scenario())
    assert all(isinstance(o, Outcome) for o in outcomes)
    statuses = [o.status for o in outcomes if isinstance(o, Outcome)]
    assert statuses == [Status.SUCCEEDED, Status.SUCCEEDED]
    results = [json.dumps(o.result, sort_keys=True) for o in outcomes if isinstance(o, Outcome)]
    assert results[0] == results[1]


def test_the_synchronous_client(pipeline: Pipeline) -> None:
    with SyncRatifierClient(_client(pipeline)) as client:
        outcome = client.call(
            "get_payment",
            {"payment_id": "pay_B2001"},
            context=context_token(pipeline.settings),
            within=60,
        )
    assert isinstance(outcome, Outcome)
    assert outcome.status is Status.DENIED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.NOT_FOUND
