"""Authorizer stage: `calls.validated` → `calls.authorized` (+ `commands.committed` for a
call that needs no approval, streams/commit.py) | denied outcome.

Identity comes from the signed context only; the resource is loaded with the actor's tenant;
the decision is the pure `commands.policy.authorize_batch`, shared with the executor. With a
backlog, calls are decided in batches (one Cedar evaluation per batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from pydantic import ValidationError

from approvals.auto import auto_approving_policy, resource_owner
from commands.catalog import Catalog, Resource, Tool, ToolArguments
from commands.freezes import NO_FREEZES, CallFacts, Freezes, frozen_scope
from commands.policy import AuthorizationRequest, Decision, PolicySet, authorize_batch
from runtime.identity import ContextKeys, call_binding_problem, verify_context_token
from runtime.turns import turn
from schemas.envelopes import (
    Actor,
    ActorRef,
    AuthorizedCall,
    Route,
    Stage,
    Status,
    ValidatedCall,
)
from schemas.errors import ErrorCode, Unauthenticated
from schemas.fingerprint import fingerprint, operation_id
from schemas.names import Topic
from streams.approval import Rules, auto_commit
from streams.commit import auto_receipt_needed, commit, committed_at_authorization
from streams.emit import Emit, outcome
from streams.repeats import (
    OperationSeen,
    OperationsSeen,
    RepeatKind,
    conflicted,
    repeat_decision,
    replayed,
)

ResourceFetch = Callable[[Tool, Actor, ToolArguments], Awaitable[Resource | None]]
ResourceAsk = tuple[Tool, Actor, ToolArguments]
# The resources of a batch's calls, in order (streams/storage.py: one query per tenant and
# tool where the tool has ``load_many``).
ResourcesFetch = Callable[[Sequence[ResourceAsk]], Awaitable[Sequence[Resource | None]]]
# The requests with their budgets' standings, for `context.budgets` (streams/budget_view.py).
BudgetsFetch = Callable[
    [Sequence[AuthorizationRequest], PolicySet, datetime], Awaitable[list[AuthorizationRequest]]
]


@dataclass(frozen=True, kw_only=True)
class _Pending:
    call: ValidatedCall
    request: AuthorizationRequest


def _ended(
    call: ValidatedCall,
    *,
    code: ErrorCode,
    tenant: str | None,
    now: datetime,
    policies: PolicySet,
    status: Status = Status.DENIED,
) -> Emit:
    return outcome(
        call_id=call.call_id,
        tool=call.tool,
        tenant=tenant,
        status=status,
        stage=Stage.AUTHORIZE,
        code=code,
        at=now,
        policy_version=policies.version,
        trace_id=call.trace_id,
        reply_to=call.reply_to,
    )


@dataclass(frozen=True, kw_only=True)
class _Checked:
    """A call whose identity, tool and arguments hold; its resource is loaded next."""

    call: ValidatedCall
    actor: Actor
    tool: Tool
    arguments: ToolArguments


def _check(
    call: ValidatedCall,
    *,
    catalog: Catalog,
    keys: ContextKeys,
    policies: PolicySet,
    now: datetime,
) -> Emit | _Checked:
    """Everything before the resource and the policy decision: identity, tool, arguments."""
    try:
        actor = verify_context_token(call.context, keys)
    except Unauthenticated:
        return _ended(call, code=ErrorCode.UNAUTHENTICATED, tenant=None, now=now, policies=policies)
    if call_binding_problem(call, actor.tenant, keys):  # a token copied onto another call
        return _ended(call, code=ErrorCode.UNAUTHENTICATED, tenant=None, now=now, policies=policies)
    tool = catalog.get(call.tool)
    if tool is None:  # the catalog changed between validation and now
        return _ended(
            call,
            code=ErrorCode.UNKNOWN_TOOL,
            tenant=actor.tenant,
            now=now,
            policies=policies,
            status=Status.REJECTED,
        )
    try:
        arguments = tool.arguments.model_validate(call.arguments, strict=True)
    except ValidationError:
        return _ended(
            call,
            code=ErrorCode.INVALID_ARGUMENTS,
            tenant=actor.tenant,
            now=now,
            policies=policies,
            status=Status.REJECTED,
        )
    return _Checked(call=call, actor=actor, tool=tool, arguments=arguments)


def _pending(
    checked: _Checked, resource: Resource | None, *, now: datetime, policies: PolicySet
) -> Emit | _Pending:
    if checked.tool.load is not None and resource is None:
        return _ended(
            checked.call,
            code=ErrorCode.NOT_FOUND,
            tenant=checked.actor.tenant,
            now=now,
            policies=policies,
        )
    return _Pending(
        call=checked.call,
        request=AuthorizationRequest(
            actor=checked.actor,
            tool=checked.tool,
            resource=resource,
            arguments=checked.call.arguments,
        ),
    )


def one_by_one(fetch: ResourceFetch) -> ResourcesFetch:
    """A batch fetch made of single fetches (for stores without a batch query)."""

    async def fetch_all(asks: Sequence[ResourceAsk]) -> Sequence[Resource | None]:
        return await asyncio.gather(*(fetch(tool, actor, args) for tool, actor, args in asks))

    return fetch_all


def _routed(
    pending: _Pending,
    decision: Decision,
    now: datetime,
    policies: PolicySet,
    freezes: Freezes = NO_FREEZES,
    *,
    receipts: Rules | None = None,
) -> tuple[Emit, ...]:
    """A denied outcome; the call's committed command when it needs no approval of any kind
    (and, since v1.8, no `calls.authorized` record: streams/commit.py); or else its
    `calls.authorized` record, for the approval-join."""
    call, request = pending.call, pending.request
    actor, tool = request.actor, request.tool
    # The kill switch (commands/freezes.py): a call in a frozen scope is refused, `frozen`.
    facts = CallFacts(
        tenant=actor.tenant,
        actor=actor.sub,
        tool=tool.name,
        effect=tool.effect,
        owner=resource_owner(request.resource),
    )
    if frozen_scope(freezes, facts) is not None:
        return (
            _ended(call, code=ErrorCode.FROZEN, tenant=actor.tenant, now=now, policies=policies),
        )
    if not decision.permitted or decision.route is None:
        denied = outcome(
            call_id=call.call_id,
            tool=call.tool,
            tenant=actor.tenant,
            status=Status.DENIED,
            stage=Stage.AUTHORIZE,
            code=decision.code or ErrorCode.POLICY_DENIED,
            at=now,
            policy_version=decision.policy_version,
            trace_id=call.trace_id,
            error=decision.error_info(),
            reply_to=call.reply_to,
        )
        return (denied,)
    authorized = AuthorizedCall(
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
            policy_version=decision.policy_version,
        ),
        effect=tool.effect,
        policy_version=decision.policy_version,
        route=decision.route,
        proposed_at=call.proposed_at,
        authorized_at=now,
        trace_id=call.trace_id,
        policies=tuple(p[:128] for p in decision.policy_ids[:16]),
        auto_approved_by=auto_approving_policy(policies, tool.effect, decision),
        resource_owner=resource_owner(request.resource, tool),
        reply_to=call.reply_to,
    )
    if committed_at_authorization(authorized):
        return (commit(authorized, now=now),)
    if receipts is not None and authorized.route is Route.AUTO and auto_receipt_needed(authorized):
        # `@approval("auto")`: committed here with the policy's signed receipt, no join hop.
        return auto_commit(authorized, now=now, rules=receipts).emits
    return (Emit(topic=Topic.AUTHORIZED, key=call.call_id, value=authorized),)


def needs_a_human(emits: tuple[Emit, ...]) -> AuthorizedCall | None:
    """The `calls.authorized` record of a call routed to a human approval, if ``emits`` is
    one (the only calls whose repeats the authorizer answers: the executor answers the
    others' from its ledger, with no approver asked)."""
    first = emits[0] if emits else None
    if (
        first is not None
        and isinstance(first.value, AuthorizedCall)
        and first.value.route is Route.APPROVAL
    ):
        return first.value
    return None


def repeat_routed(
    authorized: AuthorizedCall, seen: OperationSeen, *, now: datetime
) -> tuple[Emit, ...]:
    """A call routed to a human, given what is known of its operation (streams/repeats.py):
    its own request, the stored outcome, `conflict`, or its record keyed by the request it
    joins."""
    repeat = repeat_decision(authorized, seen)
    call_id = authorized.call_id
    if repeat.kind is RepeatKind.REPLAY and repeat.stored is not None:
        return (Emit(topic=Topic.OUTCOMES, key=call_id, value=replayed(repeat.stored, authorized)),)
    if repeat.kind is RepeatKind.CONFLICT:
        return (Emit(topic=Topic.OUTCOMES, key=call_id, value=conflicted(authorized, now=now)),)
    if repeat.kind is RepeatKind.JOIN and repeat.joins is not None:
        joining = authorized.model_copy(update={"joins": repeat.joins})
        return (Emit(topic=Topic.AUTHORIZED, key=repeat.joins, value=joining),)
    return (Emit(topic=Topic.AUTHORIZED, key=call_id, value=authorized),)


# Calls a batch's step decides before giving way to other lanes' batches (runtime/turns.py).
YIELD_EVERY = 25
_T = TypeVar("_T")
_R = TypeVar("_R")


async def _each(items: Sequence[_T], step: Callable[[_T], _R]) -> list[_R]:
    """``step`` of each item in order, giving way every ``YIELD_EVERY`` items: a backlog's
    batch of hundreds of calls would otherwise hold the process's event loop (and the
    validator's batches of other tenants in it) for tens of milliseconds at each step."""
    out: list[_R] = []
    for n, item in enumerate(items, 1):
        out.append(step(item))
        if n % YIELD_EVERY == 0:
            await turn()
    return out


async def on_validated_batch(
    calls: Sequence[ValidatedCall],
    *,
    catalog: Catalog,
    keys: ContextKeys,
    policies: PolicySet,
    fetch_many: ResourcesFetch,
    now: datetime,
    freezes: Freezes = NO_FREEZES,
    operations: OperationsSeen | None = None,
    budgets: BudgetsFetch | None = None,
    receipts: Rules | None = None,
) -> list[tuple[Emit, ...]]:
    """What the authorizer publishes for each call of a batch, in order; the resources of
    all its calls are loaded at once, and so are the operations of its calls that need a
    human (``operations``; None: every such call opens its own request). With ``receipts``
    (the approval service's keys), an `@approval("auto")` call is committed here with its
    signed receipt; without, it goes to the approval-join, which signs it."""
    checked = await _each(
        calls, lambda c: _check(c, catalog=catalog, keys=keys, policies=policies, now=now)
    )
    loading = [c for c in checked if isinstance(c, _Checked) and c.tool.load is not None]
    found = await fetch_many([(c.tool, c.actor, c.arguments) for c in loading]) if loading else ()
    resources = {id(c): r for c, r in zip(loading, found, strict=True)}
    prepared = await _each(
        checked,
        lambda c: (
            _pending(c, resources.get(id(c)), now=now, policies=policies)
            if isinstance(c, _Checked)
            else c
        ),
    )
    pending = [p for p in prepared if isinstance(p, _Pending)]
    requests = [p.request for p in pending]
    if budgets is not None and requests:  # one read of the batch's budget windows
        requests = await budgets(requests, policies, now)
    decisions = iter(authorize_batch(requests, policies))
    routed = await _each(
        prepared,
        lambda p: (
            _routed(p, next(decisions), now, policies, freezes, receipts=receipts)
            if isinstance(p, _Pending)
            else (p,)
        ),
    )
    if operations is None:
        return routed
    asking = [(i, call) for i, emits in enumerate(routed) if (call := needs_a_human(emits))]
    if asking:
        seen = await operations([call for _, call in asking])
        for (i, call), known in zip(asking, seen, strict=True):
            routed[i] = repeat_routed(call, known, now=now)
    return routed


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
    (emits,) = await on_validated_batch(
        [call],
        catalog=catalog,
        keys=keys,
        policies=policies,
        fetch_many=one_by_one(fetch),
        now=now,
    )
    return emits
