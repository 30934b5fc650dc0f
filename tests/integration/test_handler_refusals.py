"""A handler's refusal reaches the model only through a message marked safe for it; the
exception's own text (secrets, another tenant's data) never does. Through the real executor
and ledger."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from commands.catalog import Catalog, ExecutionContext, HandlerResult, Tool, ToolArguments
from commands.cedar_schema import generate_schema
from commands.policy import PolicySet
from executors.executor import CommandExecutor
from schemas.envelopes import ActorRef, CommittedCommand, Effect, Outcome, Status
from schemas.errors import SAFE_MESSAGES, ErrorCode, PermanentFailure, RefusalReason
from schemas.fingerprint import fingerprint
from schemas.providers import (
    to_anthropic_tool_result,
    to_mcp_call_tool_result,
    to_openai_tool_message,
)

pytestmark = pytest.mark.integration

SECRET = "DE89370400440532013000"


class NoArguments(ToolArguments):
    pass


async def refuse_safely(_ctx: ExecutionContext) -> HandlerResult:
    raise PermanentFailure(
        f"bank refused {SECRET} (tenant-b mirror)", for_model="The bank refused this account."
    )


async def refuse_unsafely(_ctx: ExecutionContext) -> HandlerResult:
    raise PermanentFailure(f"bank refused {SECRET} (tenant-b mirror)")


CATALOG = Catalog(
    [
        Tool(
            name=name,
            description=name,
            arguments=NoArguments,
            effect=Effect.READ,
            handler=handler,
        )
        for name, handler in (
            ("refuse_safely", refuse_safely),
            ("refuse_unsafely", refuse_unsafely),
        )
    ]
)
POLICIES = PolicySet.from_sources(
    '@id("all") permit (principal, action, resource);', generate_schema(CATALOG).text()
)


def command(tool: str) -> CommittedCommand:
    key = f"k-{uuid.uuid4().hex[:12]}"
    return CommittedCommand(
        operation_id=f"tenant-a:{key}",
        call_id=f"c-{uuid.uuid4().hex[:12]}",
        tenant="tenant-a",
        actor=ActorRef(sub="agent-1", roles=()),
        tool=tool,
        arguments={},
        fingerprint=fingerprint(
            tenant="tenant-a", tool=tool, arguments={}, policy_version=POLICIES.version
        ),
        effect=Effect.READ,
        policy_version=POLICIES.version,
        committed_at=datetime.now(UTC),
    )


def model_texts(outcome: Outcome) -> list[str]:
    return [
        to_openai_tool_message(outcome, tool_call_id="t")["content"],
        to_anthropic_tool_result(outcome, tool_use_id="t")["content"][0]["text"],
        json.dumps(to_mcp_call_tool_result(outcome)),
        outcome.model_dump_json(),
    ]


async def test_only_a_message_marked_for_the_model_reaches_it(
    pool: AsyncConnectionPool[Any],
) -> None:
    executor = CommandExecutor(pool=pool, claims=None, catalog=CATALOG, policies=POLICIES)
    safe = (await executor.execute(command("refuse_safely"), trace_id=None)).outcome
    unsafe = (await executor.execute(command("refuse_unsafely"), trace_id=None)).outcome
    for outcome in (safe, unsafe):
        assert outcome.status is Status.FAILED
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.PERMANENT_ERROR
        assert outcome.error.reason is RefusalReason.HANDLER
        for text in model_texts(outcome):
            assert SECRET not in text
            assert "tenant-b" not in text
    assert safe.error is not None
    assert unsafe.error is not None
    assert safe.error.message == "The bank refused this account."
    assert unsafe.error.message == SAFE_MESSAGES[ErrorCode.PERMANENT_ERROR]
    for text in model_texts(safe):
        assert "The bank refused this account." in text
