"""Authorizer stage: `calls.validated` → `calls.authorized` | denied outcome.

Identity comes from the signed context only; the resource is loaded with the actor's tenant;
the decision is the pure `commands.policy.authorize`, shared with the executor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from pydantic import ValidationError

from commands.catalog import Catalog, Resource, Tool, ToolArguments
from commands.policy import PolicySet, authorize
from schemas.envelopes import ActorRef, AuthorizedCall, Stage, Status, ValidatedCall
from schemas.errors import ErrorCode, Unauthenticated
from schemas.fingerprint import fingerprint, operation_id
from schemas.identity import ContextKeys, verify_context_token
from schemas.names import Topic
from streams.emit import Emit, outcome

ResourceFetch = Callable[[Tool, str, ToolArguments], Awaitable[Resource | None]]


async def on_validated(
    call: ValidatedCall,
    *,
    catalog: Catalog,
    keys: ContextKeys,
    policies: PolicySet,
    fetch: ResourceFetch,
    now: datetime,
) -> tuple[Emit, ...]:
    """Everything the authorizer publishes for one validated call."""

    def denied(code: ErrorCode, tenant: str | None, tool: str = call.tool) -> tuple[Emit, ...]:
        return (
            outcome(
                call_id=call.call_id,
                tool=tool,
                tenant=tenant,
                status=Status.DENIED,
                stage=Stage.AUTHORIZE,
                code=code,
                at=now,
                policy_version=policies.version,
                trace_id=call.trace_id,
            ),
        )

    try:
        actor = verify_context_token(call.context, keys)
    except Unauthenticated:
        return denied(ErrorCode.UNAUTHENTICATED, None)
    tool = catalog.get(call.tool)
    if tool is None:  # the catalog changed between validation and now
        return (
            outcome(
                call_id=call.call_id,
                tool=call.tool,
                tenant=actor.tenant,
                status=Status.REJECTED,
                stage=Stage.AUTHORIZE,
                code=ErrorCode.UNKNOWN_TOOL,
                at=now,
                trace_id=call.trace_id,
            ),
        )
    try:
        arguments = tool.arguments.model_validate(call.arguments, strict=True)
    except ValidationError:
        return (
            outcome(
                call_id=call.call_id,
                tool=call.tool,
                tenant=actor.tenant,
                status=Status.REJECTED,
                stage=Stage.AUTHORIZE,
                code=ErrorCode.INVALID_ARGUMENTS,
                at=now,
                trace_id=call.trace_id,
            ),
        )
    resource = await fetch(tool, actor.tenant, arguments) if tool.load is not None else None
    if tool.load is not None and resource is None:
        return denied(ErrorCode.NOT_FOUND, actor.tenant)
    decision = authorize(
        actor=actor, tool=tool, resource=resource, arguments=call.arguments, policies=policies
    )
    if not decision.permitted or decision.route is None:
        return denied(decision.code or ErrorCode.POLICY_DENIED, actor.tenant)
    return (
        Emit(
            topic=Topic.AUTHORIZED,
            key=call.call_id,
            value=AuthorizedCall(
                call_id=call.call_id,
                operation_id=operation_id(actor.tenant, call.idempotency_key),
                idempotency_key=call.idempotency_key,
                tenant=actor.tenant,
                actor=ActorRef(sub=actor.sub, roles=actor.roles),
                tool=tool.name,
                arguments=call.arguments,
                fingerprint=fingerprint(
                    tenant=actor.tenant,
                    tool=tool.name,
                    arguments=call.arguments,
                    policy_version=policies.version,
                ),
                effect=tool.effect,
                policy_version=policies.version,
                route=decision.route,
                proposed_at=call.proposed_at,
                authorized_at=now,
                trace_id=call.trace_id,
            ),
        ),
    )
