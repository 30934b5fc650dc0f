"""Outcomes rendered as provider tool results, loaded with the official SDKs' own types."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import anthropic.types
import mcp.types
import openai.types.chat
import pytest

from schemas.envelopes import ErrorInfo, FieldProblem, Outcome, Stage, Status
from schemas.errors import ErrorCode
from schemas.providers import (
    PENDING_APPROVAL_MESSAGE,
    is_error,
    result_text,
    to_anthropic_tool_result,
    to_mcp_call_tool_result,
    to_openai_tool_message,
)
from tests.unit.test_catalog_export import _validate_typed_dict

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
COMMON: dict[str, Any] = {
    "call_id": "call-1",
    "tool": "get_payment",
    "tenant": "tenant-a",
    "at": AT,
    "operation_id": "tenant-a:call-1",
    "policy_version": "pv-secret-7",
    "trace_id": "trace-xyz",
}

SUCCEEDED = Outcome(
    **COMMON,
    status=Status.SUCCEEDED,
    stage=Stage.EXECUTE,
    result={"id": "pay_A1001", "amount_minor": 1250, "created_at": AT, "note": "café"},
    resource_id="pay_A1001",
)
REJECTED = Outcome(
    **COMMON,
    status=Status.REJECTED,
    stage=Stage.VALIDATE,
    error=ErrorInfo.of(
        ErrorCode.INVALID_ARGUMENTS,
        fields=(
            FieldProblem(path="$.arguments.tenant_id", problem="unexpected field"),
            FieldProblem(path="$.arguments.payment_id", problem="required field is missing"),
        ),
    ),
)
AWAITING = Outcome(
    **COMMON,
    status=Status.AWAITING_APPROVAL,
    stage=Stage.APPROVE,
    error=ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED),
)
DENIED = Outcome(
    **COMMON, status=Status.DENIED, stage=Stage.AUTHORIZE, error=ErrorInfo.of(ErrorCode.NOT_FOUND)
)
UNKNOWN = Outcome(
    **COMMON, status=Status.UNKNOWN, stage=Stage.EXECUTE, error=ErrorInfo.of(ErrorCode.TIMEOUT)
)
ALL = (SUCCEEDED, REJECTED, AWAITING, DENIED, UNKNOWN)


def _render_all(outcome: Outcome) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return (
        to_openai_tool_message(outcome, tool_call_id="call_abc123"),
        to_anthropic_tool_result(outcome, tool_use_id="toolu_01A"),
        to_mcp_call_tool_result(outcome),
    )


@pytest.mark.parametrize("outcome", ALL, ids=lambda o: o.status.value)
def test_every_rendering_loads_as_the_sdk_type(outcome: Outcome) -> None:
    openai_msg, anthropic_block, mcp_result = _render_all(outcome)
    _validate_typed_dict(openai.types.chat.ChatCompletionToolMessageParam, openai_msg)
    _validate_typed_dict(anthropic.types.ToolResultBlockParam, anthropic_block)
    model = mcp.types.CallToolResult.model_validate(mcp_result)
    # Nothing was ignored by the SDK model (result_type is its own default, always dumped).
    dumped = model.model_dump(by_alias=True, exclude_none=True, exclude={"result_type"})
    assert dumped == mcp_result
    assert openai_msg["tool_call_id"] == "call_abc123"
    assert anthropic_block["tool_use_id"] == "toolu_01A"
    # The model reads the same text whatever the provider.
    text = result_text(outcome)
    assert openai_msg["content"] == text
    assert anthropic_block["content"] == [{"type": "text", "text": text}]
    assert model.content[0].type == "text"
    assert model.content[0].text == text
    assert anthropic_block["is_error"] is model.is_error is is_error(outcome)


def test_succeeded_renders_the_result_only() -> None:
    openai_msg, anthropic_block, mcp_result = _render_all(SUCCEEDED)
    assert openai_msg["content"] == (
        '{"id":"pay_A1001","amount_minor":1250,"created_at":"2026-11-29T12:00:00Z","note":"café"}'
    )
    assert anthropic_block["is_error"] is False
    assert mcp_result["isError"] is False
    assert mcp_result["structuredContent"] == {
        "status": "succeeded",
        "result": json.loads(openai_msg["content"]),
        "error": None,
        "resource_id": "pay_A1001",
        "call_id": "call-1",
    }


def test_rejected_renders_code_message_and_fields() -> None:
    openai_msg, anthropic_block, mcp_result = _render_all(REJECTED)
    assert json.loads(openai_msg["content"]) == {
        "status": "rejected",
        "code": "invalid_arguments",
        "message": "The arguments do not match the tool's schema.",
        "fields": [
            {"path": "$.arguments.tenant_id", "problem": "unexpected field"},
            {"path": "$.arguments.payment_id", "problem": "required field is missing"},
        ],
    }
    compact = json.dumps(json.loads(openai_msg["content"]), separators=(",", ":"))
    assert openai_msg["content"] == compact
    assert anthropic_block["is_error"] is True
    assert mcp_result["isError"] is True
    structured = mcp_result["structuredContent"]
    assert structured["status"] == "rejected"
    assert structured["result"] is None
    assert structured["error"]["code"] == "invalid_arguments"
    assert structured["error"]["retryable"] is False
    assert len(structured["error"]["fields"]) == 2


def test_awaiting_approval_is_pending_not_an_error() -> None:
    openai_msg, anthropic_block, mcp_result = _render_all(AWAITING)
    assert json.loads(openai_msg["content"]) == {
        "status": "awaiting_approval",
        "code": "approval_required",
        "message": PENDING_APPROVAL_MESSAGE,
    }
    assert anthropic_block["is_error"] is False
    assert mcp_result["isError"] is False


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.value)
def test_error_flag_for_every_status(status: Status) -> None:
    outcome = Outcome(**{**COMMON, "status": status, "stage": Stage.EXECUTE})
    expected = status not in {Status.SUCCEEDED, Status.AWAITING_APPROVAL}
    assert is_error(outcome) is expected
    assert to_anthropic_tool_result(outcome, tool_use_id="t")["is_error"] is expected
    assert to_mcp_call_tool_result(outcome)["isError"] is expected


@pytest.mark.parametrize("outcome", ALL, ids=lambda o: o.status.value)
def test_nothing_beyond_the_outcome_s_public_fields_leaks(outcome: Outcome) -> None:
    for rendered in _render_all(outcome):
        text = json.dumps(rendered)
        for private in ("tenant-a", "pv-secret-7", "trace-xyz", "tenant-a:call-1"):
            assert private not in text


def test_an_empty_provider_id_is_refused() -> None:
    with pytest.raises(ValueError, match="tool_call_id"):
        to_openai_tool_message(SUCCEEDED, tool_call_id="")
    with pytest.raises(ValueError, match="tool_use_id"):
        to_anthropic_tool_result(SUCCEEDED, tool_use_id="")
