"""The LangGraph adapter: a real `StateGraph` with a checkpointer, whose tool node goes
through the real pipeline; an approval is an ``interrupt()`` resumed with the end user's
decision, which becomes their signed confirmation."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.adapters.langgraph import RatifierToolNode
from ratifier_client.client import RatifierClient
from tests.e2e.approvals_kit import REFUND, token
from tests.e2e.conftest import Pipeline
from tests.services import run

pytestmark = pytest.mark.e2e

# What a model would answer, turn by turn: two reads (one refused), a refund, then text.
SCRIPT = [
    AIMessage(
        content="",
        tool_calls=[
            {"name": "get_payment", "args": {"payment_id": "pay_A1001"}, "id": "lg-read"},
            {"name": "get_payment", "args": {"payment_id": "pay_B2001"}, "id": "lg-refused"},
        ],
    ),
    AIMessage(
        content="", tool_calls=[{"name": "propose_refund", "args": REFUND, "id": "lg-refund"}]
    ),
    AIMessage(content="Refund done."),
]


def scripted_model(state: MessagesState) -> dict[str, list[Any]]:
    turn = sum(isinstance(m, AIMessage) for m in state["messages"])
    return {"messages": [SCRIPT[turn]]}


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def test_a_graph_interrupts_for_a_refund_and_resumes_with_the_confirmation(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings
    agent_token = token(settings, "agent-1", roles=("support", "refund"))
    customer = token(settings, "bob@example.com", roles=())  # pay_A1002 is Bob's
    thread = f"thread-{uuid.uuid4().hex[:8]}"
    config: Any = {"configurable": {"thread_id": thread}}

    async def scenario() -> tuple[Any, ...]:
        async with RatifierClient.from_settings(settings) as client:
            node = RatifierToolNode(
                client,
                context=agent_token,
                run=thread,
                confirmations=ConfirmationApi(base_url=f"http://127.0.0.1:{pipeline.http_port}"),
            )
            graph = StateGraph(MessagesState)
            graph.add_node("agent", scripted_model)
            graph.add_node("tools", node)
            graph.add_edge(START, "agent")
            graph.add_conditional_edges("agent", route, ["tools", END])
            graph.add_edge("tools", "agent")
            app = graph.compile(checkpointer=InMemorySaver())
            await app.ainvoke({"messages": [HumanMessage("Refund Bob's order")]}, config)
            stopped = await app.aget_state(config)
            interrupts = list(stopped.interrupts)
            final = await app.ainvoke(
                Command(resume={"approve": True, "user_token": customer}), config
            )
            return interrupts, final

    interrupts, final = run(scenario())
    assert len(interrupts) == 1
    waiting = interrupts[0].value
    assert waiting["tool"] == "propose_refund"
    assert waiting["preview"], "the preview the end user confirms reaches the app"
    assert waiting["subject"] == "bob@example.com"
    replies = {m.tool_call_id: m for m in final["messages"] if isinstance(m, ToolMessage)}
    assert json.loads(str(replies["lg-read"].content))["id"] == "pay_A1001"
    refused = replies["lg-refused"]
    assert refused.status == "error"
    body = json.loads(str(refused.content))
    assert (body["status"], body["code"]) == ("denied", "not_found")
    refund = replies["lg-refund"]
    assert refund.status == "success", refund.content
    assert refund.artifact["status"] == "succeeded"
    assert refund.artifact["call_id"] == waiting["call_id"]
    assert refund.artifact["approval"]["approvers"] == ["bob@example.com"]
    assert final["messages"][-1].content == "Refund done."
