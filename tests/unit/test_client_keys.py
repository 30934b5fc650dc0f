from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from config.settings import Settings
from ratifier_client.client import ProposedToolCall, RatifierClient, idempotency_key_for
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import CALL_ID_PATTERN
from schemas.lanes import proposal_key


def test_a_step_keeps_its_idempotency_key_and_other_steps_get_others() -> None:
    key = idempotency_key_for(agent="support-bot", run="conv-42", step=3)
    assert key == idempotency_key_for(agent="support-bot", run="conv-42", step=3)
    assert key != idempotency_key_for(agent="support-bot", run="conv-42", step=4)
    assert key != idempotency_key_for(agent="support-bot", run="conv-43", step=3)
    assert key != idempotency_key_for(agent="other-bot", run="conv-42", step=3)
    # No ambiguity from joining: ("a", "bc") and ("ab", "c") differ.
    assert idempotency_key_for(agent="a", run="bc", step=1) != idempotency_key_for(
        agent="ab", run="c", step=1
    )
    assert re.fullmatch(CALL_ID_PATTERN, key)


class _Producer:
    """Takes records and acknowledges them at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, dict[str, Any]]] = []

    async def send(
        self, topic: str, *, key: bytes, value: bytes, headers: Any
    ) -> asyncio.Future[None]:
        self.sent.append((key, json.loads(value)))
        acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked


async def test_the_client_keys_each_call_by_its_tenants_lane() -> None:
    """Contract v1.6: `calls.proposed` is keyed `<tenant>#<lane>`, the lane fixed per call."""
    client = RatifierClient(replies=True)  # call ids need no home partition of `outcomes`
    producer = _Producer()
    client._producer = producer
    token = issue_context_token(
        context_keys(Settings(development_mode=True)), sub="agent-1", tenant="tenant-a"
    )
    calls = [ProposedToolCall(tool="get_payment", arguments={}, context=token)] * 40
    await client.submit_many(calls)
    keys = [key for key, _ in producer.sent]
    assert set(keys) == {b"tenant-a#0", b"tenant-a#1"}
    for key, body in producer.sent:
        assert key == proposal_key(token, call_id=body["call_id"]).encode()
    # A token without a readable tenant: the call id, as before v1.6.
    producer.sent.clear()
    await client.submit_many([ProposedToolCall(tool="get_payment", arguments={}, context="x")])
    ((key, body),) = producer.sent
    assert key == body["call_id"].encode()
