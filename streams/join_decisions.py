"""What the approval-join does with one record of `calls.authorized` or `approvals.decided`,
or with a due state (the timer), given the call's state: the steps of streams/approval.py
(pure), with the I/O they need around them — an edit's arguments validated and authorized
again (the resource re-loaded), the kill switch's current freezes, the approver rights and
keys. No storage and no broker here: streams/join_service.py reads and writes the states
(streams/join_store.py) and publishes what the steps emit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from approvals.policy import PolicyRights
from approvals.signing import approval_keys, verify_decision
from commands.catalog import Catalog, Resource, Tool, ToolArguments
from commands.freezes import CallFacts, FixedFreezes, FreezeSource, frozen_scope
from commands.policy import authorize
from commands.validate import Limits, Rejection, validate
from config.settings import Settings
from feeds.policies import PolicyFeed
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    AuthorizedCall,
    ProposedCall,
    SourcePosition,
    Status,
)
from schemas.errors import ErrorCode
from schemas.fingerprint import fingerprint
from schemas.names import Topic
from streams.approval import (
    ApprovalState,
    EditRequest,
    Rules,
    Step,
    commits,
    decision_dead_letter,
    edited,
    frozen_instead,
    on_authorized,
    on_decided,
    on_tick,
)
from streams.commit import committed_by_authorizer

log = logging.getLogger("ratifier.approvals")

# Loads a tool's resource for an actor (streams/storage.py's StreamStorage.fetch).
Fetch = Callable[[Tool, Actor, ToolArguments], Awaitable[Resource | None]]


def rules_for(settings: Settings, catalog: Catalog) -> Rules:
    """What the join decides with (keys, rights, times), from the settings."""
    return Rules(
        keys=approval_keys(settings),
        ttl=timedelta(seconds=settings.approvals.ttl_seconds),
        hold=timedelta(seconds=settings.approvals.hold_seconds),
        retention=timedelta(seconds=settings.approvals.retention_margin_seconds),
        rights=PolicyRights.for_settings(settings, catalog),
    )


@dataclass(frozen=True, kw_only=True)
class Joined:
    """A record's (or a timer's) effect on its call: the state after and the steps taken."""

    state: ApprovalState | None
    steps: tuple[Step, ...]


class ApprovalJoin:
    """The join's decisions for one deployment (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog,
        feed: PolicyFeed,
        fetch: Fetch,
        limits: Limits,
        freezes: FreezeSource | None = None,
        rules: Rules | None = None,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._feed = feed
        self._fetch = fetch
        self._limits = limits
        self._freezes = freezes or FixedFreezes()
        self.rules = rules or rules_for(settings, catalog)

    async def reauthorize(self, edit: EditRequest) -> AuthorizedCall | tuple[ErrorCode, Status]:
        """An edit's arguments pass the same validation and policy as a proposal."""
        call = edit.state.authorized
        assert call is not None
        proposal = ProposedCall(
            call_id=call.call_id,
            idempotency_key=call.idempotency_key,
            tool=call.tool,
            arguments=edit.statement.arguments,
            context="approval-edit",
            proposed_at=call.proposed_at,
        )
        checked = validate(proposal, self._catalog, self._limits)
        if isinstance(checked, Rejection):
            return checked.code, Status.REJECTED
        actor = Actor(sub=call.actor.sub, tenant=call.tenant, roles=call.actor.roles)
        resource = await self._fetch(checked.tool, actor, checked.arguments)
        if checked.tool.load is not None and resource is None:
            return ErrorCode.NOT_FOUND, Status.DENIED
        policies = self._feed.current
        decision = authorize(
            actor=actor,
            tool=checked.tool,
            resource=resource,
            arguments=checked.normalized,
            policies=policies,
        )
        if not decision.permitted:
            return decision.code or ErrorCode.POLICY_DENIED, Status.DENIED
        return call.model_copy(
            update={
                "arguments": checked.normalized,
                "policy_version": policies.version,
                "fingerprint": fingerprint(
                    tenant=call.tenant,
                    tool=call.tool,
                    arguments=checked.normalized,
                    policy_version=policies.version,
                ),
            }
        )

    def unless_frozen(self, state: ApprovalState | None, step: Step, now: datetime) -> Step:
        """The kill switch: a step that would commit a call in a frozen scope ends it."""
        call = state.authorized if state is not None else None
        if state is None or call is None or not commits(step):
            return step
        facts = CallFacts(
            tenant=call.tenant,
            actor=call.actor.sub,
            tool=call.tool,
            effect=call.effect,
            owner=call.resource_owner,
        )
        freeze = frozen_scope(self._freezes.current, facts)
        if freeze is None:
            return step
        return frozen_instead(state, step, freeze, now=now, rules=self.rules)

    async def decide(
        self,
        state: ApprovalState | None,
        decision: ApprovalDecision,
        call_id: str,
        now: datetime,
    ) -> Step:
        rules = self.rules
        tool = self._catalog.get(state.authorized.tool) if state and state.authorized else None
        verified = verify_decision(decision, kafka_key=call_id, keys=rules.keys, now=now)
        step = on_decided(
            state, decision, verified, call_id=call_id, tool=tool, now=now, rules=rules
        )
        step = self.unless_frozen(state, step, now)
        if step.edit is not None:
            finished = edited(step.edit, await self.reauthorize(step.edit), now=now, rules=rules)
            step = Step(
                state=finished.state,
                emits=finished.emits,
                audits=step.audits + finished.audits,
                ended=finished.ended,
            )
        return step

    def unusable_decision(self, raw: bytes | None, key: bytes | None) -> str | None:
        """Why a record on `approvals.decided` cannot even be looked at; None if it can."""
        if not key:
            return "approval-join: decision without a key"
        if len(raw or b"") > self._settings.limits.max_record_bytes:
            return "approval-join: oversized decision"
        try:
            ApprovalDecision.model_validate_json(raw or b"")
        except (ValidationError, ValueError):
            try:
                old = json.loads(raw or b"")
            except ValueError:
                old = None
            if isinstance(old, dict) and "approver" in old:
                return "approval-join: unsigned decision (v1 record with a bearer token)"
            return "approval-join: unreadable decision"
        return None

    async def on_record(
        self,
        kind: Topic,
        key: bytes | None,
        value: bytes | None,
        position: SourcePosition,
        state: ApprovalState | None,
        *,
        now: datetime | None = None,
    ) -> Joined | None:
        """The effect of one record on its call's ``state`` (keyed by ``key``); None for a
        call the authorizer committed itself (not the join's: no state, no hop). A record
        that cannot be read raises ValueError (pydantic's ValidationError is one): the caller
        dead-letters it."""
        now = now or datetime.now(UTC)
        if kind is Topic.APPROVALS_DECIDED:
            refused = self.unusable_decision(value, key)
            if refused is not None:
                letter = decision_dead_letter(
                    value,
                    reason=refused,
                    key=(key or b"").decode(errors="replace") or None,
                    source=position,
                    at=now,
                )
                # The call's own state is untouched: a poison record under its key is no
                # reason to forget (or change) its pending approval.
                return Joined(state=state, steps=(Step(state=state, emits=(letter,)),))
        if not key:
            raise ValueError("a record without a key")
        call_id = key.decode(errors="replace")
        if kind is Topic.AUTHORIZED:
            call = AuthorizedCall.model_validate_json(value or b"")
            if committed_by_authorizer(call):
                return None
            rules = self.rules
            step = on_authorized(
                state, call, tool=self._catalog.get(call.tool), now=now, rules=rules
            )
            steps = [step]
            state = step.state
            for held in step.replay:
                step = await self.decide(state, held, call_id, now)
                steps.append(step)
                state = step.state
            return Joined(state=state, steps=tuple(steps))
        decision = ApprovalDecision.model_validate_json(value or b"")
        step = await self.decide(state, decision, call_id, now)
        return Joined(state=step.state, steps=(step,))

    def on_due(self, state: ApprovalState | None, *, now: datetime) -> Joined:
        """The timer's turn on a due state: expire it, drop its held decisions, or forget it
        (streams/approval.py's ``on_tick``)."""
        step = on_tick(state, now=now, rules=self.rules)
        return Joined(state=step.state, steps=(step,))


def readable_state(raw: bytes | None) -> ApprovalState | None:
    """A stored state, or None. A state this version cannot read (one written before
    decisions were signed, holding v1 decisions) is treated as absent, never a crash: held
    decisions are re-sent by the approvers' tools; pending states of v1 still read."""
    if not raw:
        return None
    try:
        return ApprovalState.model_validate_json(raw)
    except ValidationError:
        log.warning("approval state unreadable by this version; treated as absent")
        return None
