"""`ratifier mcp` with the MCP SDK's own client over streamable HTTP, on the real pipeline."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ratifier.mcp_gateway import STATUS_TOOL
from ratifier.processes import WorkerProcess, start_worker_args
from tests.e2e.approvals_kit import REFUND, decide, token
from tests.e2e.conftest import Pipeline
from tests.services import context_token, run

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def gateway(pipeline: Pipeline) -> Iterator[str]:
    port = _free_port()
    worker: WorkerProcess = start_worker_args(
        [
            "mcp",
            "--port",
            str(port),
            "--approvals-url",
            f"http://127.0.0.1:{pipeline.http_port}",
        ],
        name="mcp",
        log_dir=pipeline.log_dir,
        env=pipeline.env,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert worker.process.poll() is None, worker.log_tail()
            time.sleep(0.1)
    try:
        yield url
    finally:
        worker.stop()


async def _session(url: str, bearer: str | None, steps: Any, elicitation: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else None
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(
            streamable_http_client(url, http_client=http), elicitation_callback=elicitation
        ) as client,
    ):
        return await steps(client)


def _still_pending(result: types.CallToolResult) -> bool:
    """The gateway's answer for a call that is not final yet: it says to ask again."""
    body = result.structured_content or {}
    return body.get("ask_again_with") == STATUS_TOOL


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None
    return dict(result.structured_content)


def test_tools_are_the_catalog_and_calls_go_through_the_pipeline(
    pipeline: Pipeline, gateway: str
) -> None:
    bearer = context_token(pipeline.settings)

    async def steps(client: Client) -> tuple[Any, ...]:
        listed = await client.list_tools()
        read = await client.call_tool("get_payment", {"payment_id": "pay_A1001"})
        smuggled = await client.call_tool(
            "get_payment",
            {"payment_id": "pay_B2001"},
            meta=cast(types.RequestParamsMeta, {"tenant": "tenant-b", "sub": "root"}),
        )
        invalid = await client.call_tool(
            "get_payment", {"payment_id": "pay_A1001", "tenant_id": "tenant-b"}
        )
        return listed, read, smuggled, invalid

    listed, read, smuggled, invalid = run(_session(gateway, bearer, steps))
    names = {tool.name for tool in listed.tools}
    assert {"get_payment", "propose_refund", STATUS_TOOL} <= names
    get_payment = next(t for t in listed.tools if t.name == "get_payment")
    assert get_payment.annotations is not None
    assert get_payment.annotations.read_only_hint is True
    assert not read.is_error
    assert "pay_A1001" in read.content[0].text
    # _meta named tenant-b: the call still ran as tenant-a, so tenant-b's payment is not found.
    assert smuggled.is_error
    assert "not_found" in smuggled.content[0].text
    assert invalid.is_error
    assert "invalid_arguments" in invalid.content[0].text


def test_no_bearer_token_no_session(pipeline: Pipeline, gateway: str) -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx2.Client() as http:
        missing = http.post(gateway, json=request)
        forged = http.post(
            gateway,
            json=request,
            headers={"Authorization": "Bearer " + context_token(pipeline.settings) + "x"},
        )
    assert missing.status_code == 401
    assert "Bearer" in missing.headers.get("www-authenticate", "")
    assert forged.status_code == 401


def test_a_write_waiting_for_approval_is_pending_then_answered_by_the_status_tool(
    pipeline: Pipeline, gateway: str
) -> None:
    settings = pipeline.settings
    bearer = token(settings, "agent-1", roles=("refund",))

    async def propose(client: Client) -> types.CallToolResult:
        return await client.call_tool("propose_refund", REFUND)

    pending = run(_session(gateway, bearer, propose))
    assert not pending.is_error
    body = _structured(pending)
    assert body["status"] == "awaiting_approval"
    call_id = body["call_id"]
    assert body["preview"]

    request = _request_of(pipeline, call_id)
    decide(pipeline, request, token(settings, "boss"))

    async def status(client: Client) -> types.CallToolResult:
        return await client.call_tool(STATUS_TOOL, {"call_id": call_id})

    async def status_until_settled(client: Client) -> list[types.CallToolResult]:
        # As an agent is told to: ask again while the call waits. The decision still has to
        # pass the join, the executor and the provider, so the first answer may be pending.
        answers = [await status(client)]
        deadline = time.monotonic() + 60
        while _still_pending(answers[-1]) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            answers.append(await status(client))
        return answers

    # Another principal asking about the call learns nothing.
    stranger = run(_session(gateway, context_token(settings, sub="agent-9"), status))
    assert stranger.is_error
    assert "not_found" in stranger.content[0].text
    answers = run(_session(gateway, bearer, status_until_settled))
    assert not any(a.is_error for a in answers), answers
    assert all(_still_pending(a) for a in answers[:-1])
    assert "succeeded" in answers[-1].content[0].text


def test_the_user_confirms_their_own_refund_through_elicitation(
    pipeline: Pipeline, gateway: str
) -> None:
    settings = pipeline.settings
    # Bob asks for a refund of his own payment (pay_A1002): he is the subject who confirms.
    bob = token(settings, "bob@example.com", roles=("refund",))
    asked: list[types.ElicitRequestParams] = []

    async def accept(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def propose(client: Client) -> types.CallToolResult:
        return await client.call_tool("propose_refund", REFUND)

    result = run(_session(gateway, bob, propose, elicitation=accept))
    assert len(asked) == 1
    assert isinstance(asked[0], types.ElicitRequestFormParams)
    assert "pay_A1002" in asked[0].message or "0.10" in asked[0].message, asked[0].message
    assert not result.is_error, result
    body = _structured(result)
    assert body["status"] == "succeeded", body


def _request_of(pipeline: Pipeline, call_id: str) -> dict[str, Any]:
    import json

    from schemas.names import Topic
    from tests.services import read_until

    records = run(
        read_until(
            pipeline.settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: any(json.loads(r.value)["call_id"] == call_id for r in recs),
            timeout=30,
        )
    )
    found = [json.loads(r.value) for r in records if json.loads(r.value)["call_id"] == call_id]
    return dict(found[0])
