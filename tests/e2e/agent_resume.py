"""A restarted agent runtime: resumes a serialized OpenAI Agents SDK `RunState` in a process
of its own (tests/e2e/test_approval_repeats.py starts it as ``python -m``).

Reads ``{"state", "run", "context"}`` as JSON on stdin; its settings come from the
environment, like a worker's. Writes ``{"final_output", "tool_outputs"}`` as JSON on stdout.
The scripted model's remaining turn is the answer after the tool's output."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import Agent, RunConfig, Runner, RunState
from agents.testing import ScriptedModel, assistant_message

from commands.catalog import load_catalog
from commands.export import export_catalog
from config.settings import Settings
from ratifier_client.adapters.openai_agents import RatifierAgentTools
from ratifier_client.client import RatifierClient


def tool_outputs(model_input: Any) -> dict[str, str]:
    """The tool outputs the model was given, by tool call id."""
    items = model_input if isinstance(model_input, list) else []
    return {
        item["call_id"]: str(item["output"])
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


async def resume(state_text: str, run: str, context: str) -> dict[str, Any]:
    settings = Settings()
    definitions = export_catalog(load_catalog(settings.catalog), "openai")
    assert isinstance(definitions, list)
    model = ScriptedModel([[assistant_message("Refund done.")]])
    async with RatifierClient.from_settings(settings) as client:
        tools = RatifierAgentTools(client, definitions, context=context, run=run, within=60)
        agent = Agent(name="support", model=model, tools=list(tools.function_tools))
        state = await RunState.from_string(agent, state_text)
        result = await Runner.run(agent, state, run_config=RunConfig(tracing_disabled=True))
    outputs: dict[str, str] = {}
    for call in model.calls:
        outputs.update(tool_outputs(call.input))
    return {"final_output": result.final_output, "tool_outputs": outputs}


def main() -> None:
    asked = json.load(sys.stdin)
    answer = asyncio.run(resume(asked["state"], asked["run"], asked["context"]))
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
