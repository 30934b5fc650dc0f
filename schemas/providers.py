"""An `Outcome` rendered as each provider's tool result: OpenAI Chat Completions ``tool``
message, Anthropic ``tool_result`` content block, MCP ``CallToolResult``.

Pure functions, no I/O. What the model sees (the text) is the same for every provider:

- ``succeeded``: the compact JSON of ``result`` and nothing else.
- any other status: a compact JSON object with ``status`` and, when the outcome has an
  error, its ``code``, its safe ``message`` (a policy's ``@message``, a handler's message
  marked for the model or an approver's reason when there is one, else the code's generic
  text), its ``reason`` (``forbid``, ``no_permit``, ``evaluation_error``, ``handler``,
  ``approver``) and its ``fields`` (``reason`` and ``fields`` only when there are any), and
  ``retry_after`` (seconds) when the refusal says when to propose the call again
  (``rate_limited``, v1.5).
  ``awaiting_approval`` says ``"pending human approval"`` instead of an error message, or
  ``"pending the customer's confirmation"`` when the call waits for its subject to confirm.

Nothing beyond those values is rendered: no tenant, actor, operation id or policy version.

Error flag (``is_error`` / ``isError``): false for ``succeeded`` and for
``awaiting_approval`` (not an error: the call is parked until a human decides, and its final
outcome follows on ``outcomes``; the text says so, so the model does not take it for a
result). True for every other status, ``unknown`` included: an effect whose outcome is not
known yet must not be read as a success.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.envelopes import Outcome, Status
from schemas.errors import AWAITING_CONFIRMATION_MESSAGE

PENDING_APPROVAL_MESSAGE = "pending human approval"
PENDING_CONFIRMATION_MESSAGE = "pending the customer's confirmation"
# Statuses whose tool result is not flagged as an error.
NOT_ERROR_STATUSES: frozenset[Status] = frozenset({Status.SUCCEEDED, Status.AWAITING_APPROVAL})


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def is_error(outcome: Outcome) -> bool:
    """Whether providers should flag the tool result as an error (see module docstring)."""
    return outcome.status not in NOT_ERROR_STATUSES


def _error_json(outcome: Outcome) -> dict[str, Any] | None:
    error = outcome.model_dump(mode="json", include={"error"})["error"]
    return error if isinstance(error, dict) else None


def result_text(outcome: Outcome) -> str:
    """The text a model reads for ``outcome``, identical for every provider."""
    if outcome.status is Status.SUCCEEDED:
        # mode="json" turns datetimes, decimals and the like a handler left in `result` into
        # the same JSON values the outcome carries on the wire.
        return _compact(outcome.model_dump(mode="json", include={"result"})["result"])
    body: dict[str, Any] = {"status": outcome.status.value}
    error = _error_json(outcome)
    if error is not None:
        body["code"] = error["code"]
    if outcome.status is Status.AWAITING_APPROVAL:
        confirming = error is not None and error["message"] == AWAITING_CONFIRMATION_MESSAGE
        body["message"] = PENDING_CONFIRMATION_MESSAGE if confirming else PENDING_APPROVAL_MESSAGE
    elif error is not None:
        body["message"] = error["message"]
    if error is not None and error.get("reason"):
        body["reason"] = error["reason"]
    if error is not None and error["fields"]:
        body["fields"] = error["fields"]
    if error is not None and error.get("retry_after") is not None:
        body["retry_after"] = error["retry_after"]  # v1.5: when to propose it again
    return _compact(body)


def structured_content(outcome: Outcome) -> dict[str, Any]:
    """``{status, result, error, resource_id, call_id}`` as JSON values; ``error`` is null or
    ``{code, message, retryable, fields, reason, policies}`` (``policies``: the ``@id`` of the
    policies that refused the call)."""
    dumped = outcome.model_dump(
        mode="json", include={"status", "result", "error", "resource_id", "call_id"}
    )
    return {
        "status": dumped["status"],
        "result": dumped["result"],
        "error": dumped["error"],
        "resource_id": dumped["resource_id"],
        "call_id": dumped["call_id"],
    }


def _require_id(name: str, value: str) -> str:
    if not value:
        raise ValueError(f"{name} must be the provider's non-empty tool call id")
    return value


def to_openai_tool_message(outcome: Outcome, *, tool_call_id: str) -> dict[str, Any]:
    """An OpenAI Chat Completions ``{"role": "tool"}`` message answering ``tool_call_id``
    (the id of the ``tool_calls[i]`` entry, which the outcome does not carry). OpenAI tool
    messages have no error flag: the text carries the status."""
    return {
        "role": "tool",
        "tool_call_id": _require_id("tool_call_id", tool_call_id),
        "content": result_text(outcome),
    }


def to_anthropic_tool_result(outcome: Outcome, *, tool_use_id: str) -> dict[str, Any]:
    """An Anthropic ``tool_result`` content block answering the ``tool_use`` block
    ``tool_use_id``; it goes in the next ``user`` message."""
    return {
        "type": "tool_result",
        "tool_use_id": _require_id("tool_use_id", tool_use_id),
        "content": [{"type": "text", "text": result_text(outcome)}],
        "is_error": is_error(outcome),
    }


def to_mcp_call_tool_result(outcome: Outcome) -> dict[str, Any]:
    """An MCP ``CallToolResult`` (the ``result`` of a ``tools/call`` response). The text block
    is the same model-facing text as for the other providers; ``structuredContent`` holds
    the machine-readable outcome (see `structured_content`)."""
    return {
        "content": [{"type": "text", "text": result_text(outcome)}],
        "structuredContent": structured_content(outcome),
        "isError": is_error(outcome),
    }
