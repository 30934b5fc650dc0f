"""The OpenAI Agents SDK adapter: a real `Agent` run, with a scripted model emitting tool
calls, through the real pipeline; approval is the SDK's interruption, confirmed by the end
user through the approval API."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from commands.catalog import load_catalog
from commands.export import export_catalog
from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.adapters.openai_agents import RatifierAgentTools
from ratifier_client.client import RatifierClient
from schemas.envelopes import Outcome, Status
from tests.e2e.approvals_kit import REFUND, token
from tests.e2e.conftest import Pipeline
from tests.services import run

pytestmark = pytest.mark.e2e

NO_TRACING = RunConfig(tracing_disabled=True)


def _tool_outputs(model_input: Any) -> dict[str, str]:
    """The tool outputs the model was given, by tool call id."""
    items = model_input if isinstance(model_input, list) else []
    return {
        item["call_id"]: str(item["output"])
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def test_an_agent_reads_is_refused_and_gets_a_refund_confirmed(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    definitions = export_catalog(load_catalog(settings.catalog), "openai")
    assert isinstance(definitions, list)
    agent_token = token(settings, "agent-1", roles=("support", "refund"))
    customer = token(settings, "bob@example.com", roles=())  # pay_A1002 is Bob's
    model = ScriptedModel(
        [
            [function_call("get_payment", {"payment_id": "pay_A1001"}, call_id="tc-read")],
            [function_call("get_payment", {"payment_id": "pay_B2001"}, call_id="tc-refused")],
            [function_call("propose_refund", REFUND, call_id="tc-refund")],
            [assistant_message("Refund done.")],
        ]
    )

    async def scenario() -> tuple[Any, ...]:
        async with RatifierClient.from_settings(settings) as client:
            tools = RatifierAgentTools(
                client,
                definitions,
                context=agent_token,
                run=f"run-{uuid.uuid4().hex[:8]}",
                confirmations=ConfirmationApi(base_url=f"http://127.0.0.1:{pipeline.http_port}"),
            )
            agent = Agent(name="support", model=model, tools=list(tools.function_tools))
            first = await Runner.run(agent, "Refund Bob's late delivery", run_config=NO_TRACING)
            interruptions = list(first.interruptions)
            assert [i.call_id for i in interruptions] == ["tc-refund"], interruptions
            waiting = tools.awaiting(interruptions[0])
            state = first.to_state()
            await tools.confirm(state, interruptions[0], user_token=customer, approve=True)
            final = await Runner.run(agent, state, run_config=NO_TRACING)
            refund = await tools.outcome(interruptions[0], within=5)
            return waiting, final, refund

    waiting, final, refund = run(scenario())
    assert waiting is not None
    assert waiting.outcome.status is Status.AWAITING_APPROVAL
    assert waiting.preview, "the preview the end user confirms reaches the app"
    assert waiting.request is not None and waiting.request.subject == "bob@example.com"
    assert final.final_output == "Refund done."
    outputs: dict[str, str] = {}
    for call in model.calls:
        outputs.update(_tool_outputs(call.input))
    assert json.loads(outputs["tc-read"])["id"] == "pay_A1001"
    refused = json.loads(outputs["tc-refused"])
    assert (refused["status"], refused["code"]) == ("denied", "not_found")
    assert refused["message"]
    assert isinstance(refund, Outcome)
    assert refund.status is Status.SUCCEEDED
    assert refund.approval is not None
    assert list(refund.approval.approvers) == ["bob@example.com"]
    assert json.loads(outputs["tc-refund"]) == refund.result
