"""A LangGraph tool node whose tool calls go through ratifier, with ``interrupt()`` for
approval.

    node = RatifierToolNode(client, context=agent_token, run=thread_id,
                            confirmations=ConfirmationApi(base_url="http://127.0.0.1:6066"))
    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", node)
    ...
    app = graph.compile(checkpointer=InMemorySaver())
    app.invoke({"messages": [...]}, config)              # stops at an approval
    waiting = app.get_state(config).interrupts[0].value  # {"call_id", "tool", "preview", ...}
    app.invoke(Command(resume={"approve": True, "user_token": customer_token}), config)

The node runs the tool calls of the last AI message: each is published to ratifier (its
idempotency key derived from ``run`` and the tool call id) and answered with a `ToolMessage`
carrying `schemas.providers.result_text` (refusals with ``status="error"``, their code, message
and reason). When ratifier answers ``awaiting_approval``, the node calls ``interrupt()`` with
the call id, tool, arguments, preview, expiry and the subject who may confirm. The graph's
checkpointer keeps the run; ``Command(resume=decision)`` continues it, where ``decision`` is

- ``{"approve": bool, "user_token": str, "reason": str | None}``: the end user's decision,
  published as their signed confirmation (``POST /confirmations/{call_id}``), or
- ``{"approve": bool}`` without a token: staff decided in ratifier (dashboard, `/approvals`);
  the node just awaits the final outcome.

LangGraph re-runs a node from its start on resume: calls already published by this node
object are recognised by tool call id and never published twice (and a restarted process
re-proposing the same tool call reuses its idempotency key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.types import interrupt

from ratifier_client.adapters.calls import ToolCall, ToolCalls
from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.client import (
    DEFAULT_WAIT_SECONDS,
    AwaitingApproval,
    Pending,
    RatifierClient,
)
from schemas.providers import is_error, result_text

ContextSource = str | Callable[[Mapping[str, Any]], str]


def approval_payload(tool: str, awaiting: AwaitingApproval) -> dict[str, Any]:
    """What ``interrupt()`` shows the app: JSON values only (checkpointers store it)."""
    request = awaiting.request
    return {
        "call_id": awaiting.call_id,
        "tool": tool,
        "arguments": dict(request.arguments) if request is not None else {},
        "preview": list(awaiting.preview),
        "expires_at": awaiting.expires_at.isoformat() if awaiting.expires_at else None,
        "subject": request.subject if request is not None else None,
    }


@dataclass(eq=False)
class RatifierToolNode:
    """A graph node (``graph.add_node("tools", node)``) over a state with ``messages``.

    ``context`` is the agent's signed context token, or a function of the graph state that
    returns it. ``run`` names the run (e.g. the thread id) for idempotency keys.
    """

    client: RatifierClient
    context: ContextSource
    run: str
    agent: str = "langgraph"
    confirmations: ConfirmationApi | None = None
    within: float = DEFAULT_WAIT_SECONDS
    _calls: ToolCalls = field(init=False)

    def __post_init__(self) -> None:
        self._calls = ToolCalls(self.client, agent=self.agent, run=self.run, within=self.within)

    async def __call__(self, state: Any) -> dict[str, list[ToolMessage]]:
        last = state["messages"][-1]
        if not isinstance(last, AIMessage):
            return {"messages": []}
        replies: list[ToolMessage] = []
        for tool_call in last.tool_calls:
            tool_call_id = str(tool_call["id"])
            call = await self._submitted(tool_call["name"], tool_call["args"], tool_call_id, state)
            if call.awaiting is not None:
                # Called again on every re-run: LangGraph matches resume values to
                # interrupts by their order in the node.
                decision = interrupt(approval_payload(tool_call["name"], call.awaiting))
                await self._decided(call, decision)
            replies.append(await self._reply(call, tool_call["name"], tool_call_id))
        return {"messages": replies}

    async def _submitted(
        self, tool: str, arguments: Mapping[str, Any], tool_call_id: str, state: Mapping[str, Any]
    ) -> ToolCall:
        context = self.context(state) if callable(self.context) else self.context
        return await self._calls.submitted(tool, arguments, tool_call_id, context=context)

    async def _decided(self, call: ToolCall, decision: Any) -> None:
        """Turn the resume value into the end user's signed confirmation, when it is one
        (once: later re-runs of the node see the same resume value)."""
        if call.decided:
            return
        if not isinstance(decision, Mapping):
            raise TypeError("resume with {'approve': bool, 'user_token': ..., 'reason': ...}")
        user_token = decision.get("user_token")
        if user_token is None:
            call.decided = True
            return  # staff decide in ratifier; the outcome says what they decided
        if self.confirmations is None:
            raise ValueError("RatifierToolNode needs confirmations=ConfirmationApi(...)")
        await self.confirmations.confirm(
            call.handle.call_id,
            user_token=str(user_token),
            approve=bool(decision.get("approve")),
            reason=decision.get("reason"),
        )
        call.decided = True

    async def _reply(self, call: ToolCall, tool: str, tool_call_id: str) -> ToolMessage:
        outcome = await self._calls.final(call)
        if isinstance(outcome, Pending):
            body = {
                "status": outcome.status.value if outcome.status else "pending",
                "call_id": outcome.call_id,
                "message": "The call is still in progress; its outcome is not known yet.",
            }
            return ToolMessage(
                content=json.dumps(body, separators=(",", ":")),
                tool_call_id=tool_call_id,
                name=tool,
            )
        return ToolMessage(
            content=result_text(outcome),
            tool_call_id=tool_call_id,
            name=tool,
            status="error" if is_error(outcome) else "success",
            artifact=outcome.model_dump(mode="json"),
        )
