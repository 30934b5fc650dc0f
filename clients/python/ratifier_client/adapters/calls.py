"""The ratifier calls of an adapter's tool calls (no framework imported here): one call per
framework tool call id, published on first sight with an idempotency key derived from the
run and that id, so a framework that runs a node or an approval check again never proposes
a tool call twice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratifier_client.client import (
    AwaitingApproval,
    CallHandle,
    Pending,
    RatifierClient,
    idempotency_key_for,
)
from schemas.envelopes import Outcome


@dataclass(eq=False)
class ToolCall:
    handle: CallHandle
    awaiting: AwaitingApproval | None = None
    outcome: Outcome | None = None  # the final one, once the framework was answered with it
    decided: bool = False  # the app's decision on the approval was acted on (LangGraph)


class ToolCalls:
    """An adapter's calls, by the framework's tool call id."""

    def __init__(self, client: RatifierClient, *, agent: str, run: str, within: float) -> None:
        self._client = client
        self._agent = agent
        self._run = run
        self._within = within
        self._calls: dict[str, ToolCall] = {}

    def get(self, tool_call_id: str) -> ToolCall | None:
        return self._calls.get(tool_call_id)

    async def submitted(
        self, tool: str, arguments: Mapping[str, Any], tool_call_id: str, *, context: str
    ) -> ToolCall:
        """The ratifier call of this tool call: published on first sight, and known to be
        finished or waiting for approval before this returns."""
        call = self._calls.get(tool_call_id)
        if call is not None:
            return call
        # Returns at the first of: awaiting approval, final outcome, the wait ending; a
        # `rate_limited` refusal is proposed again after its retry_after (same key).
        handle = await self._client.submit_admitted(
            tool,
            arguments,
            context=context,
            idempotency_key=idempotency_key_for(
                agent=self._agent, run=self._run, step=tool_call_id
            ),
            within=self._within,
        )
        call = ToolCall(handle=handle)
        self._calls[tool_call_id] = call
        call.awaiting = await handle.approval(within=0)
        return call

    async def final(self, call: ToolCall) -> Outcome | Pending:
        """The call's final outcome (the client stops tracking it), or Pending when the wait
        ended first."""
        outcome = call.outcome or await call.handle.result(within=self._within)
        if isinstance(outcome, Pending):
            return outcome
        call.outcome = outcome
        self._client.forget(call.handle.call_id)
        return outcome
