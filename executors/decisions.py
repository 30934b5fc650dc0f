"""Pure decisions of the executor: dedup against the ledger, approval receipts, the
commit-time re-check around the resource load, outcome status per error code."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pydantic import ValidationError

from approvals.auto import resource_owner
from approvals.signing import ApprovalKeys, DecisionRefusal, receipt_refusal
from commands.catalog import Resource, Tool, ToolArguments
from commands.freezes import CallFacts, Freezes, frozen_scope
from commands.policy import APPROVAL_EFFECTS, AuthorizationRequest, PolicySet, authorize_batch
from schemas.envelopes import Actor, CommittedCommand, Effect, FreezeRecord, Status
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint

TERMINAL_LEDGER_STATUSES = frozenset(
    {s.value for s in Status} - {Status.AWAITING_APPROVAL.value, Status.UNKNOWN.value}
)


class Dedup(StrEnum):
    REPLAY = "replay"  # same key, same fingerprint, finished: return the stored outcome
    CONFLICT = "conflict"  # same key, different fingerprint
    IN_FLIGHT = "in_flight"  # same key, same fingerprint, not finished: never re-run blindly


def dedup_decision(*, stored_fingerprint: str, stored_status: str, fingerprint: str) -> Dedup:
    if stored_fingerprint != fingerprint:
        return Dedup.CONFLICT
    if stored_status in TERMINAL_LEDGER_STATUSES:
        return Dedup.REPLAY
    return Dedup.IN_FLIGHT


def receipt_problem(
    command: CommittedCommand, tool: Tool, now: datetime, keys: ApprovalKeys
) -> ErrorCode | None:
    """Why this command may not run as committed, or None. Checks the fingerprint against the
    arguments being executed and, for effects that need one, the approval receipt: signed by
    the approval service for this call, tenant, fingerprint and policy version, unexpired
    (the same verification as the approval-join's, `approvals.signing.receipt_refusal`)."""
    expected = fingerprint(
        tenant=command.tenant,
        tool=command.tool,
        arguments=command.arguments,
        policy_version=command.policy_version,
    )
    if expected != command.fingerprint:
        return ErrorCode.PRECONDITION_FAILED
    if tool.effect not in APPROVAL_EFFECTS:
        return None
    refusal = receipt_refusal(
        command.approval,
        call_id=command.call_id,
        tenant=command.tenant,
        fingerprint=command.fingerprint,
        policy_version=command.policy_version,
        keys=keys,
        now=now,
    )
    if refusal is DecisionRefusal.REQUEST_EXPIRED:
        return ErrorCode.APPROVAL_EXPIRED
    return ErrorCode.PRECONDITION_FAILED if refusal is not None else None


def plain_read(command: CommittedCommand, tool: Tool | None) -> bool:
    """A read with nothing to deduplicate: no claim, no ledger entry (docs/execution.md,
    "Reads"). Both the committed command and the catalog must say `read`, and the tool must
    have no external effect."""
    return (
        command.effect is Effect.READ
        and tool is not None
        and tool.effect is Effect.READ
        and tool.external is None
    )


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """A command that passed the re-check's first half: its verified actor and its arguments
    validated again against the tool's model."""

    actor: Actor
    arguments: ToolArguments


def admission(
    command: CommittedCommand,
    tool: Tool,
    *,
    cancelled: Container[str],
    now: datetime,
    keys: ApprovalKeys,
) -> Admitted | ErrorCode:
    """The commit-time checks before the resource is loaded: cancellation, fingerprint and
    receipt, strict argument validation. The refusal's code, or what the load needs."""
    if command.call_id in cancelled:
        return ErrorCode.CANCELLED
    problem = receipt_problem(command, tool, now, keys)
    if problem is not None:
        return problem
    try:
        arguments = tool.arguments.model_validate(command.arguments, strict=True)
    except ValidationError:
        return ErrorCode.INVALID_ARGUMENTS
    actor = Actor(sub=command.actor.sub, tenant=command.tenant, roles=command.actor.roles)
    return Admitted(actor=actor, arguments=arguments)


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """An admitted command with the resource its tool's loader found (None: not found, or
    the tool has no loader)."""

    command: CommittedCommand
    tool: Tool
    admitted: Admitted
    resource: Resource | None


def resource_refusals(loaded: Sequence[Loaded], policies: PolicySet) -> list[ErrorCode | None]:
    """The commit-time checks after the load, for many commands in one policy evaluation:
    a resource that should exist and does not is `not_found`; a policy that no longer
    permits the call on the fresh resource is `precondition_failed`; None: go on."""
    refusals: list[ErrorCode | None] = [
        ErrorCode.NOT_FOUND if item.tool.load is not None and item.resource is None else None
        for item in loaded
    ]
    asked = [i for i, refusal in enumerate(refusals) if refusal is None]
    decisions = authorize_batch(
        [
            AuthorizationRequest(
                actor=loaded[i].admitted.actor,
                tool=loaded[i].tool,
                resource=loaded[i].resource,
                arguments=loaded[i].command.arguments,
            )
            for i in asked
        ],
        policies,
    )
    for i, decision in zip(asked, decisions, strict=True):
        if not decision.permitted:
            refusals[i] = ErrorCode.PRECONDITION_FAILED
    return refusals


def command_freeze(
    view: Freezes, command: CommittedCommand, resource: Resource | None
) -> FreezeRecord | None:
    """The kill switch at commit time: the freeze whose scope this command falls in (its
    effect has not started), or None."""
    facts = CallFacts(
        tenant=command.tenant,
        actor=command.actor.sub,
        tool=command.tool,
        effect=command.effect,
        owner=resource_owner(resource),
    )
    return frozen_scope(view, facts)


STATUS_BY_CODE: dict[ErrorCode, Status] = {
    ErrorCode.CONFLICT: Status.CONFLICT,
    ErrorCode.APPROVAL_EXPIRED: Status.EXPIRED,
    ErrorCode.CANCELLED: Status.CANCELLED,
    ErrorCode.TIMEOUT: Status.UNKNOWN,
    ErrorCode.FROZEN: Status.DENIED,
    ErrorCode.BUDGET_EXCEEDED: Status.DENIED,
    # Not attempted: the downstream's breaker is open (retryable, with retry_after).
    ErrorCode.UNAVAILABLE: Status.REJECTED,
}


def status_for(code: ErrorCode) -> Status:
    return STATUS_BY_CODE.get(code, Status.FAILED)
