"""Idempotency across approvals (issue 25, item 2), through the real pipeline: a step proposed
again with its idempotency key gets the operation's stored outcome, or joins its pending
approval request; never a second request, never a second effect. And an OpenAI Agents SDK
run resumed from its serialized `RunState` in a new process ends with the tool's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, RunState, ToolApprovalItem
from agents.testing import ScriptedModel, function_call

from commands.catalog import load_catalog
from commands.export import export_catalog
from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.adapters.openai_agents import RatifierAgentTools
from ratifier_client.client import RatifierClient
from schemas.envelopes import ApprovalVerdict
from schemas.names import Topic
from tests.e2e.approvals_kit import REFUND, decide, terminal_outcomes, token
from tests.e2e.conftest import Pipeline
from tests.e2e.executor_kit import provider_stats
from tests.services import keyed_call, outcomes_by_call, publish, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def propose_with_key(pipeline: Pipeline, key: str) -> str:
    """A refund proposed by a new client (a new call id) under idempotency key ``key``."""
    call_id = f"rp-{uuid.uuid4().hex[:12]}"
    requester = token(pipeline.settings, "agent-1", roles=("refund",))
    body = keyed_call(call_id, "propose_refund", REFUND, key, requester)
    run(publish(pipeline.settings, [(call_id, body)]))
    return call_id


def requests_of(pipeline: Pipeline, operation_id: str) -> list[dict[str, Any]]:
    """Every record on `approvals.requested` for ``operation_id``."""
    records = run(read_to_end(pipeline.settings, [Topic.APPROVALS_REQUESTED]))
    bodies = [json.loads(r.value) for r in records]
    return [b for b in bodies if b["operation_id"] == operation_id]


def first_outcome(pipeline: Pipeline, call_id: str, status: str) -> dict[str, Any]:
    """The first outcome of ``call_id`` with ``status``, waited for."""

    def seen(records: list[Any]) -> bool:
        return any(o["status"] == status for o in outcomes_by_call(records).get(call_id, []))

    records = run(read_until(pipeline.settings, [Topic.OUTCOMES], seen, timeout=60))
    return next(o for o in outcomes_by_call(records)[call_id] if o["status"] == status)


def request_of(pipeline: Pipeline, call_id: str) -> dict[str, Any]:
    def seen(records: list[Any]) -> bool:
        return any(json.loads(r.value)["call_id"] == call_id for r in records)

    records = run(read_until(pipeline.settings, [Topic.APPROVALS_REQUESTED], seen, timeout=60))
    return next(json.loads(r.value) for r in records if json.loads(r.value)["call_id"] == call_id)


def test_an_executed_refund_proposed_again_gets_its_stored_outcome(pipeline: Pipeline) -> None:
    key = f"idem-{uuid.uuid4().hex[:12]}"
    first = propose_with_key(pipeline, key)
    request = request_of(pipeline, first)
    decide(pipeline, request, token(pipeline.settings, "boss"))
    (done,) = terminal_outcomes(pipeline, {first})[first]
    assert done["status"] == "succeeded", done
    operation = done["operation_id"]
    assert operation == f"tenant-a:{key}"

    again = propose_with_key(pipeline, key)  # a new client, the same step
    (answer,) = terminal_outcomes(pipeline, {again})[again]
    assert answer["status"] == "succeeded", answer
    assert answer["repeats"] == first
    assert answer["result"] == done["result"]
    assert answer["operation_id"] == operation
    # Nothing asked of an approver again, no awaiting outcome, one effect.
    assert [r["call_id"] for r in requests_of(pipeline, operation)] == [first]
    statuses = [
        o["status"]
        for o in outcomes_by_call(run(read_to_end(pipeline.settings, [Topic.OUTCOMES])))[again]
    ]
    assert statuses == ["succeeded"], statuses
    assert provider_stats(pipeline.provider_url)["by_key"][operation] == 1


def test_a_refund_proposed_twice_while_pending_has_one_request(pipeline: Pipeline) -> None:
    key = f"idem-{uuid.uuid4().hex[:12]}"
    first = propose_with_key(pipeline, key)
    request = request_of(pipeline, first)
    second = propose_with_key(pipeline, key)
    waiting = first_outcome(pipeline, second, "awaiting_approval")
    assert waiting["repeats"] == first
    operation = request["operation_id"]
    assert [r["call_id"] for r in requests_of(pipeline, operation)] == [first]

    decide(pipeline, request, token(pipeline.settings, "boss"))
    ended = terminal_outcomes(pipeline, {first, second})
    assert [o["status"] for o in ended[first]] == ["succeeded"], ended
    assert [o["status"] for o in ended[second]] == ["succeeded"], ended
    assert ended[second][0]["repeats"] == first
    assert ended[second][0]["result"] == ended[first][0]["result"]
    assert [r["call_id"] for r in requests_of(pipeline, operation)] == [first]
    assert provider_stats(pipeline.provider_url)["by_key"][operation] == 1


def test_a_rejected_refund_proposed_again_is_told_the_rejection(pipeline: Pipeline) -> None:
    key = f"idem-{uuid.uuid4().hex[:12]}"
    first = propose_with_key(pipeline, key)
    request = request_of(pipeline, first)
    decide(pipeline, request, token(pipeline.settings, "boss"), ApprovalVerdict.REJECT)
    (rejected,) = terminal_outcomes(pipeline, {first})[first]
    assert rejected["status"] == "rejected", rejected

    again = propose_with_key(pipeline, key)
    (answer,) = terminal_outcomes(pipeline, {again})[again]
    assert (answer["status"], answer["repeats"]) == ("rejected", first), answer
    assert answer["error"]["code"] == "approval_rejected"
    assert [r["call_id"] for r in requests_of(pipeline, request["operation_id"])] == [first]
    assert request["operation_id"] not in provider_stats(pipeline.provider_url)["by_key"]


NO_TRACING = RunConfig(tracing_disabled=True)


async def stopped_at_approval(
    tools: RatifierAgentTools, model: ScriptedModel
) -> tuple[ToolApprovalItem, str, RunState[Any]]:
    """The agent's run, stopped at its one approval: the SDK's item, ratifier's call id and
    the run's state."""
    agent = Agent(name="support", model=model, tools=list(tools.function_tools))
    first = await Runner.run(agent, "Refund Bob's late delivery", run_config=NO_TRACING)
    (item,) = first.interruptions
    call_id = tools.call_id(item)
    assert call_id is not None
    return item, call_id, first.to_state()


def test_an_agents_sdk_run_resumed_in_a_new_process_ends_with_the_result(
    pipeline: Pipeline,
) -> None:
    """The run stops at the refund's approval; the end user confirms it; the agent runtime
    goes away with the serialized `RunState`. The refund is executed meanwhile. A new process
    resumes the state: the tool proposes its step again (same key) and gets the result."""
    settings = pipeline.settings
    definitions = export_catalog(load_catalog(settings.catalog), "openai")
    assert isinstance(definitions, list)
    agent_token = token(settings, "agent-1", roles=("support", "refund"))
    customer = token(settings, "bob@example.com", roles=())  # pay_A1002 is Bob's
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    model = ScriptedModel([[function_call("propose_refund", REFUND, call_id="tc-refund")]])

    async def until_the_restart() -> tuple[str, str]:  # the first runtime
        async with RatifierClient.from_settings(settings) as client:
            tools = RatifierAgentTools(
                client,
                definitions,
                context=agent_token,
                run=run_id,
                confirmations=ConfirmationApi(base_url=f"http://127.0.0.1:{pipeline.http_port}"),
            )
            item, call_id, state = await stopped_at_approval(tools, model)
            await tools.confirm(state, item, user_token=customer, approve=True)
            return state.to_string(), call_id

    state_text, first_call = run(until_the_restart())
    (done,) = terminal_outcomes(pipeline, {first_call})[first_call]
    assert done["status"] == "succeeded", done

    resumed = subprocess.run(
        [sys.executable, "-m", "tests.e2e.agent_resume"],
        input=json.dumps({"state": state_text, "run": run_id, "context": agent_token}),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **pipeline.env},
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    answer = json.loads(resumed.stdout)
    assert answer["final_output"] == "Refund done."
    assert json.loads(answer["tool_outputs"]["tc-refund"]) == done["result"]
    operation = done["operation_id"]
    assert len(requests_of(pipeline, operation)) == 1
    assert provider_stats(pipeline.provider_url)["by_key"][operation] == 1


def test_an_agents_sdk_run_resumed_while_pending_joins_the_request(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """The runtime goes away while the refund waits for staff; the new process resumes the
    run at once: its tool's call joins the pending request, and ends with the refund's result
    once staff approve. One request, one effect."""
    settings = pipeline.settings
    definitions = export_catalog(load_catalog(settings.catalog), "openai")
    assert isinstance(definitions, list)
    agent_token = token(settings, "agent-1", roles=("support", "refund"))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    model = ScriptedModel([[function_call("propose_refund", REFUND, call_id="tc-refund")]])

    async def until_the_restart() -> tuple[str, str]:
        async with RatifierClient.from_settings(settings) as client:
            tools = RatifierAgentTools(client, definitions, context=agent_token, run=run_id)
            item, call_id, state = await stopped_at_approval(tools, model)
            state.approve(item)  # staff will decide in ratifier: the tool awaits them
            return state.to_string(), call_id

    state_text, first_call = run(until_the_restart())
    request = request_of(pipeline, first_call)
    asked = tmp_path / "resume.json"
    asked.write_text(json.dumps({"state": state_text, "run": run_id, "context": agent_token}))
    with asked.open() as stdin:
        resumed = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.agent_resume"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **pipeline.env},
        )
    try:
        operation = request["operation_id"]

        def joined(records: list[Any]) -> bool:
            return any(
                o["status"] == "awaiting_approval" and o.get("repeats") == first_call
                for found in outcomes_by_call(records).values()
                for o in found
            )

        run(read_until(settings, [Topic.OUTCOMES], joined, timeout=60))
        decide(pipeline, request, token(settings, "boss"))
        out, err = resumed.communicate(timeout=120)
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
    assert resumed.returncode == 0, err[-4000:]
    answer = json.loads(out)
    (done,) = terminal_outcomes(pipeline, {first_call})[first_call]
    assert done["status"] == "succeeded", done
    assert answer["final_output"] == "Refund done."
    assert json.loads(answer["tool_outputs"]["tc-refund"]) == done["result"]
    assert [r["call_id"] for r in requests_of(pipeline, operation)] == [first_call]
    assert provider_stats(pipeline.provider_url)["by_key"][operation] == 1
