"""MCP elicitation in the gateway, in process (no Kafka): the caller who is the subject of a
call waiting for confirmation is asked with a form, in both protocol eras, and the answer
becomes their confirmation. The e2e test (tests/e2e/test_mcp_gateway.py) runs it for real."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import mcp_types as types
import pytest
from mcp.client import Client

from commands.catalog import load_catalog
from config.settings import Settings
from ratifier.mcp_gateway import McpGateway
from ratifier_client.client import Pending
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import ApprovalRequest, Outcome, Status

SETTINGS = Settings()
KEYS = context_keys(SETTINGS)
NOW = datetime.now(UTC)
REFUND = {"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late"}


def _request(subject: str) -> ApprovalRequest:
    return ApprovalRequest(
        call_id="call-1",
        operation_id="op-1",
        tenant="tenant-a",
        tool="propose_refund",
        arguments=REFUND,
        preview=("Refund 0.10 of pay_A1002",),
        fingerprint="f" * 64,
        effect="external_write",
        policy_version="p1",
        requested_by="bob@example.com",
        expires_at=NOW + timedelta(minutes=5),
        subject=subject,
    )


@dataclass
class WaitingCall:
    """The client side of one refund that waits for its subject's confirmation."""

    subject: str
    decided: bool | None = None

    @dataclass(frozen=True)
    class Handle:
        call_id: str

    async def submit_admitted(
        self, tool: str, arguments: Any, *, context: str, within: float
    ) -> WaitingCall.Handle:
        return WaitingCall.Handle("call-1")

    async def awaiting_approval(self, call_id: str, *, within: float) -> None:
        return None

    async def wait(self, call_id: str, *, within: float) -> Outcome | Pending:
        if self.decided is None:
            await asyncio.sleep(0)
            return Pending(
                call_id=call_id, status=Status.AWAITING_APPROVAL, approval=_request(self.subject)
            )
        return Outcome.model_validate(
            {
                "call_id": call_id,
                "tool": "propose_refund",
                "tenant": "tenant-a",
                "status": "succeeded" if self.decided else "failed",
                "stage": "execute" if self.decided else "approve",
                "at": NOW.isoformat(),
                "result": {"refund_id": "re_1"} if self.decided else None,
            }
        )

    def forget(self, call_id: str) -> None:
        pass


@dataclass
class Confirmations:
    call: WaitingCall
    posted: list[tuple[str, bool, str]] = field(default_factory=list)

    async def confirm(
        self, call_id: str, *, user_token: str, approve: bool, reason: str | None = None
    ) -> dict[str, Any]:
        self.posted.append((call_id, approve, user_token))
        self.call.decided = approve
        return {}


def _call(mode: str, subject: str, action: str, confirm: bool = True) -> tuple[Any, ...]:
    caller = issue_context_token(KEYS, sub="bob@example.com", tenant="tenant-a", roles=("refund",))
    call = WaitingCall(subject=subject)
    confirmations = Confirmations(call)
    gateway = McpGateway(
        catalog=load_catalog(SETTINGS.catalog),
        client=cast(Any, call),
        keys=KEYS,
        fixed_context=caller,
        confirmations=cast(Any, confirmations),
        wait_seconds=0.1,
    )
    asked: list[str] = []

    async def answer(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        del context  # the request context: unused here
        asked.append(params.message)
        content = {"confirm": confirm} if action == "accept" else None
        return types.ElicitResult(action=cast(Any, action), content=content)

    async def steps() -> types.CallToolResult:
        async with Client(
            gateway.server(), elicitation_callback=answer, mode=cast(Any, mode)
        ) as client:
            return await client.call_tool("propose_refund", REFUND)

    result = asyncio.run(steps())
    return result, asked, confirmations.posted, caller


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_subject_confirms_through_the_form(mode: str) -> None:
    result, asked, posted, caller = _call(mode, "bob@example.com", "accept")
    assert asked == ["Confirm this action:\nRefund 0.10 of pay_A1002"]
    assert posted == [("call-1", True, caller)]
    assert not result.is_error
    assert result.structured_content["status"] == "succeeded"


@pytest.mark.parametrize(("action", "confirm"), [("decline", True), ("accept", False)])
def test_a_declined_form_is_a_refusal(action: str, confirm: bool) -> None:
    result, _asked, posted, caller = _call("legacy", "bob@example.com", action, confirm)
    assert posted == [("call-1", False, caller)]
    assert result.structured_content["status"] == "failed"


def test_cancel_or_someone_elses_confirmation_stays_pending() -> None:
    cancelled, asked, posted, _ = _call("legacy", "bob@example.com", "cancel")
    assert (len(asked), posted) == (1, [])
    assert cancelled.structured_content["status"] == "awaiting_approval"
    other, asked, posted, _ = _call("legacy", "alice@example.com", "accept")
    assert (asked, posted) == ([], [])
    assert other.structured_content["status"] == "awaiting_approval"
