"""The adapters' pure parts: tool definitions from both export forms, the interrupt payload,
the confirmation API's URL check."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from commands.catalog import load_catalog
from commands.export import export_catalog
from config.settings import Settings
from ratifier_client.adapters.confirmation import ConfirmationApi
from ratifier_client.adapters.langgraph import approval_payload
from ratifier_client.adapters.openai_agents import RatifierAgentTools, tool_definitions
from ratifier_client.client import AwaitingApproval, RatifierClient
from schemas.envelopes import ApprovalRequest, Outcome, Status


def _exported(fmt: str) -> list[dict[str, Any]]:
    exported = export_catalog(load_catalog(Settings().catalog), fmt)
    assert isinstance(exported, list)
    return exported


def test_openai_and_mcp_exports_give_the_same_tools() -> None:
    openai = {d.name: d for d in tool_definitions(_exported("openai"))}
    mcp = {d.name: d for d in tool_definitions(_exported("mcp"))}
    assert set(openai) == set(mcp)
    assert "propose_refund" in openai
    assert all(d.strict for d in openai.values())
    assert not any(d.strict for d in mcp.values())


def test_function_tools_are_built_without_touching_kafka() -> None:
    client = RatifierClient(bootstrap="127.0.0.1:1")  # never started
    tools = RatifierAgentTools(client, _exported("openai"), context="token", run="run-1")
    names = [tool.name for tool in tools.function_tools]
    assert "get_payment" in names
    assert all(callable(tool.needs_approval) for tool in tools.function_tools)


def test_the_interrupt_payload_is_plain_json() -> None:
    expires = datetime(2026, 1, 1, tzinfo=UTC)
    request = ApprovalRequest(
        call_id="call-1",
        operation_id="op-1",
        tenant="tenant-a",
        tool="propose_refund",
        arguments={"payment_id": "pay_A1002"},
        preview=("Refund 0.10",),
        fingerprint="f" * 64,
        effect="external_write",
        policy_version="v1",
        requested_by="agent-1",
        expires_at=expires,
        subject="bob@example.com",
    )
    outcome = Outcome.model_validate(
        {
            "call_id": "call-1",
            "tool": "propose_refund",
            "tenant": "tenant-a",
            "status": Status.AWAITING_APPROVAL,
            "stage": "approve",
            "at": expires.isoformat(),
        }
    )
    payload = approval_payload(
        "propose_refund", AwaitingApproval(call_id="call-1", outcome=outcome, request=request)
    )
    assert payload == {
        "call_id": "call-1",
        "tool": "propose_refund",
        "arguments": {"payment_id": "pay_A1002"},
        "preview": ["Refund 0.10"],
        "expires_at": expires.isoformat(),
        "subject": "bob@example.com",
    }


def test_the_confirmation_api_is_http_only() -> None:
    with pytest.raises(ValueError, match="http"):
        ConfirmationApi(base_url="file:///etc/passwd")
    assert ConfirmationApi(base_url="http://127.0.0.1:6066").base_url
