"""The catalog as OpenAI Agents SDK tools, every invocation through ratifier.

    definitions = export_catalog(catalog, "openai")         # or `ratifier export --format openai`
    tools = RatifierAgentTools(client, definitions, context=agent_token, run=run_id)
    agent = Agent(name="support", tools=tools.function_tools, model=...)
    result = await Runner.run(agent, "Refund pay_A1002")
    while result.interruptions:                            # ratifier said awaiting_approval
        state = result.to_state()
        for item in result.interruptions:
            waiting = tools.awaiting(item)                 # preview and expiry, for the user
            await tools.confirm(state, item, user_token=customer_token, approve=True)
        result = await Runner.run(agent, state)

How ratifier's approval maps to the SDK's approval interruptions:

- Each tool's ``needs_approval`` callable *publishes* the call (idempotency key derived from
  ``run`` and the model's tool call id, so a re-evaluation never proposes twice) and waits
  until ratifier either finishes it or answers ``awaiting_approval``. Only the latter returns
  True: the run stops with a `ToolApprovalItem` for that tool call in ``result.interruptions``.
  Reads and refusals never interrupt.
- ``on_invoke_tool`` never publishes: it awaits the final outcome of the call already
  published for this tool call id and returns `schemas.providers.result_text` (a refusal's
  code, message and reason reach the model as the tool's output, not as an exception).
- ``confirm(state, item, user_token=..., approve=...)`` turns the app's decision into the end
  user's signed confirmation (``POST /confirmations/{call_id}`` on the approval API, with the
  token of the subject the call acts for) and records the same decision in the SDK's
  `RunState` (``approve`` / ``reject``). When staff approve instead (the dashboard or
  `/approvals`), call ``state.approve(item)`` alone: the resumed tool awaits their decision.
- A rejected SDK item is not executed by the SDK; ratifier's call ends ``rejected`` from the
  declined confirmation (or expires when nobody declined it in ratifier).
- A wait that ends before the final outcome returns a pending text naming the call id
  (``ratifier_client.client.Pending``), never a failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem
from agents.tool_context import ToolContext

from ratifier_client.adapters.calls import ToolCall, ToolCalls
from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.client import (
    DEFAULT_WAIT_SECONDS,
    AwaitingApproval,
    Pending,
    RatifierClient,
)
from schemas.envelopes import Outcome
from schemas.providers import result_text

ContextSource = str | Callable[[Any], str]


def pending_text(pending: Pending) -> str:
    """What the model reads when the wait ended first: the call goes on."""
    body: dict[str, Any] = {
        "status": pending.status.value if pending.status else "pending",
        "call_id": pending.call_id,
        "message": "The call is still in progress; its outcome is not known yet.",
    }
    return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class ToolDefinition:
    """One exported tool: its name, description, argument schema, and whether the schema is
    in OpenAI strict form."""

    name: str
    description: str
    schema: dict[str, Any]
    strict: bool


def tool_definitions(definitions: Sequence[Mapping[str, Any]]) -> list[ToolDefinition]:
    """The tools of exported definitions in the ``openai`` form (``{"type": "function",
    "function": {...}}``, strict schemas) or the ``mcp`` form (``{"name", "description",
    "inputSchema"}``)."""
    found: list[ToolDefinition] = []
    for entry in definitions:
        if "function" in entry:
            function = entry["function"]
            found.append(
                ToolDefinition(
                    name=function["name"],
                    description=function.get("description", ""),
                    schema=dict(function["parameters"]),
                    strict=bool(function.get("strict", False)),
                )
            )
        else:
            found.append(
                ToolDefinition(
                    name=entry["name"],
                    description=entry.get("description", ""),
                    schema=dict(entry["inputSchema"]),
                    strict=False,
                )
            )
    return found


class RatifierAgentTools:
    """`FunctionTool`s for the exported catalog, over one `RatifierClient`.

    ``context`` is the agent's signed context token, or a function of the run's context
    object (``Runner.run(..., context=...)``) that returns it. ``run`` names the agent run:
    with the model's tool call id it makes each call's idempotency key, so resuming a run
    (or re-evaluating its approvals) never proposes a tool call twice.
    """

    def __init__(
        self,
        client: RatifierClient,
        definitions: Sequence[Mapping[str, Any]],
        *,
        context: ContextSource,
        run: str,
        agent: str = "openai-agents",
        confirmations: ConfirmationApi | None = None,
        within: float = DEFAULT_WAIT_SECONDS,
    ) -> None:
        self._context = context
        self._confirmations = confirmations
        self._calls = ToolCalls(client, agent=agent, run=run, within=within)
        self.function_tools: list[FunctionTool] = [
            self._function_tool(definition) for definition in tool_definitions(definitions)
        ]

    def _function_tool(self, definition: ToolDefinition) -> FunctionTool:
        name = definition.name

        async def needs_approval(
            run_context: RunContextWrapper[Any], arguments: dict[str, Any], tool_call_id: str
        ) -> bool:
            call = await self._submitted(name, arguments, tool_call_id, run_context.context)
            return call.awaiting is not None

        async def invoke(tool_context: ToolContext[Any], raw_arguments: str) -> str:
            arguments = json.loads(raw_arguments or "{}")
            call = await self._submitted(
                name, arguments, tool_context.tool_call_id, tool_context.context
            )
            outcome = await self._calls.final(call)
            if isinstance(outcome, Pending):
                return pending_text(outcome)
            return result_text(outcome)

        return FunctionTool(
            name=name,
            description=definition.description,
            params_json_schema=definition.schema,
            on_invoke_tool=invoke,
            strict_json_schema=definition.strict,
            needs_approval=needs_approval,
        )

    async def _submitted(
        self, tool: str, arguments: Mapping[str, Any], tool_call_id: str, run_context: Any
    ) -> ToolCall:
        context = self._context(run_context) if callable(self._context) else self._context
        return await self._calls.submitted(tool, arguments, tool_call_id, context=context)

    def awaiting(self, item: ToolApprovalItem) -> AwaitingApproval | None:
        """What ratifier waits for on this interruption (the preview to show, the expiry)."""
        call = self._calls.get(item.call_id or "")
        return call.awaiting if call is not None else None

    def call_id(self, item: ToolApprovalItem) -> str | None:
        """ratifier's call id for this interruption."""
        call = self._calls.get(item.call_id or "")
        return call.handle.call_id if call is not None else None

    async def confirm(
        self,
        state: RunState[Any],
        item: ToolApprovalItem,
        *,
        user_token: str,
        approve: bool,
        reason: str | None = None,
    ) -> None:
        """The end user's decision on ``item``: published as their signed confirmation of the
        exact preview, and recorded in ``state`` for the SDK."""
        if self._confirmations is None:
            raise ValueError("RatifierAgentTools needs confirmations=ConfirmationApi(...)")
        call_id = self.call_id(item)
        if call_id is None:
            raise KeyError(f"no ratifier call for tool call {item.call_id}")
        await self._confirmations.confirm(
            call_id, user_token=user_token, approve=approve, reason=reason
        )
        if approve:
            state.approve(item)
        else:
            state.reject(item, rejection_message=reason)

    async def outcome(self, item: ToolApprovalItem, within: float = 0.0) -> Outcome | Pending:
        """The ratifier outcome of an interrupted tool call (e.g. after a rejection)."""
        call = self._calls.get(item.call_id or "")
        if call is None:
            raise KeyError(f"no ratifier call for tool call {item.call_id}")
        if call.outcome is not None:
            return call.outcome
        return await call.handle.result(within=within)
