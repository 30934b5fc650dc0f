"""The MCP gateway's own refusals (a status question about a call that is not yours, a call
without a verified token) have the shape of every refusal the pipeline answers, in process
(no Kafka). tests/e2e/test_mcp_gateway.py asks the status tool for real."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import mcp_types as types
from mcp.client import Client

from commands.catalog import load_catalog
from config.settings import Settings
from ratifier.mcp_gateway import STATUS_TOOL, McpGateway
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode
from schemas.providers import to_mcp_call_tool_result

SETTINGS = Settings()
KEYS = context_keys(SETTINGS)


def _pipeline_refusal() -> dict[str, Any]:
    """What the gateway answers for a call the authorizer denied."""
    return to_mcp_call_tool_result(
        Outcome(
            call_id="call-1",
            tool="propose_refund",
            tenant="tenant-a",
            status=Status.DENIED,
            stage=Stage.AUTHORIZE,
            error=ErrorInfo.of(ErrorCode.POLICY_DENIED),
            at=datetime.now(UTC),
        )
    )


def _ask(context: str | None, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    gateway = McpGateway(
        catalog=load_catalog(SETTINGS.catalog),
        client=cast(Any, None),  # never reached: both refusals come before any call
        keys=KEYS,
        fixed_context=context,
        wait_seconds=0.1,
    )

    async def steps() -> types.CallToolResult:
        async with Client(gateway.server()) as client:
            return await client.call_tool(tool, arguments)

    return asyncio.run(steps())


def _assert_refusal_shape(result: types.CallToolResult, code: ErrorCode) -> dict[str, Any]:
    common = _pipeline_refusal()
    assert result.is_error
    structured: dict[str, Any] | None = result.structured_content
    assert structured is not None
    assert structured.keys() == common["structuredContent"].keys()
    assert structured["error"].keys() == common["structuredContent"]["error"].keys()
    assert structured["status"] == "denied"
    assert structured["error"]["code"] == code.value
    assert structured["error"]["retryable"] is False
    assert structured["result"] is None
    text = json.loads(cast(types.TextContent, result.content[0]).text)
    assert text.keys() == json.loads(common["content"][0]["text"]).keys()
    assert text["code"] == code.value
    assert text["message"] == structured["error"]["message"]
    return structured


def test_the_status_tool_refuses_a_call_that_is_not_yours_like_any_refusal() -> None:
    token = issue_context_token(KEYS, sub="agent-9", tenant="tenant-a", roles=("support",))
    result = _ask(token, STATUS_TOOL, {"call_id": "call-of-someone-else"})
    structured = _assert_refusal_shape(result, ErrorCode.NOT_FOUND)
    assert structured["call_id"] == "call-of-someone-else"
    assert structured["error"]["message"] == "No call with this id is pending for you."


def test_a_call_without_a_verified_token_is_refused_like_any_refusal() -> None:
    result = _ask(None, "get_payment", {"payment_id": "pay_A1001"})
    structured = _assert_refusal_shape(result, ErrorCode.UNAUTHENTICATED)
    assert structured["call_id"] is None


class RateLimitedClient:
    """A client whose every call was refused `rate_limited` even after its own retries."""

    @dataclass(frozen=True)
    class Handle:
        call_id: str

    async def submit_admitted(
        self, tool: str, arguments: Any, *, context: str, within: float
    ) -> RateLimitedClient.Handle:
        return RateLimitedClient.Handle("call-1")

    async def awaiting_approval(self, call_id: str, *, within: float) -> None:
        return None

    async def wait(self, call_id: str, *, within: float) -> Outcome:
        return Outcome(
            call_id=call_id,
            tool="get_payment",
            tenant="tenant-a",
            status=Status.REJECTED,
            stage=Stage.VALIDATE,
            error=ErrorInfo.of(ErrorCode.RATE_LIMITED, retry_after=2.5),
            at=datetime.now(UTC),
        )

    def forget(self, call_id: str) -> None:
        pass


def test_a_rate_limited_call_is_an_error_result_that_says_when_to_retry() -> None:
    token = issue_context_token(KEYS, sub="agent-9", tenant="tenant-a", roles=("support",))
    gateway = McpGateway(
        catalog=load_catalog(SETTINGS.catalog),
        client=cast(Any, RateLimitedClient()),
        keys=KEYS,
        fixed_context=token,
        wait_seconds=0.1,
    )

    async def steps() -> types.CallToolResult:
        async with Client(gateway.server()) as client:
            return await client.call_tool("get_payment", {"payment_id": "pay_A1001"})

    result = asyncio.run(steps())
    assert result.is_error
    text = json.loads(cast(types.TextContent, result.content[0]).text)
    assert text["code"] == "rate_limited" and text["retry_after"] == 2.5
    structured = result.structured_content
    assert structured is not None
    assert structured["error"]["retryable"] is True
    assert structured["error"]["retry_after"] == 2.5
