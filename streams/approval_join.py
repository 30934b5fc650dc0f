"""Wiring of the approval-join into the faust app: one agent over the co-partitioned
`calls.authorized`, `approvals.decided` and `approvals.timers` topics, a changelog-backed
table of approval states keyed by call id, and a timer that nudges due states.

Records are processed one at a time (not in batches): a faust table write belongs to the
partition of the event being processed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import faust
from pydantic import ValidationError

from approvals.policy import PolicyRights
from approvals.signing import approval_keys, verify_decision
from commands.catalog import Catalog
from commands.freezes import CallFacts, FixedFreezes, FreezeSource, frozen_scope
from commands.policy import authorize
from commands.validate import Limits, Rejection, validate
from config.settings import Settings
from feeds.policies import PolicyFeed
from runtime.identity import ContextKeys
from runtime.retry import retrying
from schemas.envelopes import (
    Actor,
    ApprovalDecision,
    AuthorizedCall,
    ProposedCall,
    SourcePosition,
    Stage,
    Status,
)
from schemas.errors import ErrorCode, StorageUnavailable
from schemas.fingerprint import fingerprint
from schemas.names import APPROVAL_TABLE, Topic
from schemas.vocabulary import StreamStage
from streams.approval import (
    ApprovalState,
    EditRequest,
    Rules,
    Step,
    commits,
    decision_dead_letter,
    due,
    edited,
    frozen_instead,
    on_authorized,
    on_decided,
    on_tick,
)
from streams.commit import committed_by_authorizer
from streams.emit import Emit
from streams.observe import StageObserver
from streams.storage import StreamStorage
from streams.validator import dead_letter
from telemetry.tracing import parse_traceparent, traceparent_of

log = logging.getLogger("ratifier.approvals")

Publish = Callable[[tuple[Emit, ...], bytes | None], Awaitable[None]]
TICK_EVERY = 1.0
RETICK_AFTER = 5.0


def install_approval_join(
    app: faust.App,
    settings: Settings,
    *,
    topics: dict[Topic, Any],
    catalog: Catalog,
    feed: PolicyFeed,
    storage: StreamStorage,
    keys: ContextKeys,
    limits: Limits,
    publish: Publish,
    observer: StageObserver,
    freezes: FreezeSource | None = None,
) -> None:
    frozen = freezes or FixedFreezes()
    table = app.Table(
        APPROVAL_TABLE,
        default=None,
        key_type=bytes,
        value_type=bytes,
        partitions=settings.topic_partitions,
    )
    rules = Rules(
        keys=approval_keys(settings),
        ttl=timedelta(seconds=settings.approvals.ttl_seconds),
        hold=timedelta(seconds=settings.approvals.hold_seconds),
        retention=timedelta(seconds=settings.approvals.retention_margin_seconds),
        rights=PolicyRights.for_settings(settings, catalog),
    )
    names = {
        settings.topic(t): t
        for t in (Topic.AUTHORIZED, Topic.APPROVALS_DECIDED, Topic.APPROVAL_TIMERS)
    }
    source = app.topic(*names, key_type=bytes, value_type=bytes)
    ticked: dict[str, float] = {}

    def load(key: bytes) -> ApprovalState | None:
        return readable_state(table.get(key))

    async def reauthorize(edit: EditRequest) -> AuthorizedCall | tuple[ErrorCode, Status]:
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
        checked = validate(proposal, catalog, limits)
        if isinstance(checked, Rejection):
            return checked.code, Status.REJECTED
        actor = Actor(sub=call.actor.sub, tenant=call.tenant, roles=call.actor.roles)
        resource = await storage.fetch(checked.tool, actor, checked.arguments)
        if checked.tool.load is not None and resource is None:
            return ErrorCode.NOT_FOUND, Status.DENIED
        policies = feed.current
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

    def unless_frozen(state: ApprovalState | None, step: Step, now: datetime) -> Step:
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
        freeze = frozen_scope(frozen.current, facts)
        if freeze is None:
            return step
        return frozen_instead(state, step, freeze, now=now, rules=rules)

    async def decide(
        state: ApprovalState | None, decision: ApprovalDecision, call_id: str, now: datetime
    ) -> Step:
        tool = catalog.get(state.authorized.tool) if state and state.authorized else None
        verified = verify_decision(decision, kafka_key=call_id, keys=rules.keys, now=now)
        step = on_decided(
            state, decision, verified, call_id=call_id, tool=tool, now=now, rules=rules
        )
        step = unless_frozen(state, step, now)
        if step.edit is not None:
            finished = edited(step.edit, await reauthorize(step.edit), now=now, rules=rules)
            step = Step(
                state=finished.state, emits=finished.emits, audits=step.audits + finished.audits
            )
        return step

    def unusable_decision(raw: bytes | None, key: bytes | None) -> str | None:
        """Why a record on `approvals.decided` cannot even be looked at; None if it can."""
        if not key:
            return "approval-join: decision without a key"
        if len(raw or b"") > settings.limits.max_record_bytes:
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

    async def handle(
        event: Any, position: SourcePosition
    ) -> tuple[ApprovalState | None, list[Step]] | None:
        """The state after ``event`` and the steps that led there; None for a call the
        authorizer committed itself (not the join's: no state, no hop)."""
        message = event.message
        kind = names.get(message.topic)
        key: bytes = event.key or b""
        now = datetime.now(UTC)
        if kind is Topic.APPROVALS_DECIDED:
            refused = unusable_decision(event.value, event.key)
            if refused is not None:
                letter = decision_dead_letter(
                    event.value,
                    reason=refused,
                    key=key.decode(errors="replace") or None,
                    source=position,
                    at=now,
                )
                # The call's own state is untouched: a poison record under its key is no
                # reason to forget (or change) its pending approval.
                untouched = load(key) if key else None
                return untouched, [Step(state=untouched, emits=(letter,))]
        if not key:
            raise ValueError("a record without a key")
        authorized = (
            AuthorizedCall.model_validate_json(event.value or b"")
            if kind is Topic.AUTHORIZED
            else None
        )
        if authorized is not None and committed_by_authorizer(authorized):
            return None
        state = load(key)
        call_id = key.decode(errors="replace")
        steps: list[Step] = []
        if authorized is not None:
            call = authorized
            step = on_authorized(state, call, tool=catalog.get(call.tool), now=now, rules=rules)
            steps.append(step)
            state = step.state
            for held in step.replay:
                step = await decide(state, held, call_id, now)
                steps.append(step)
                state = step.state
        elif kind is Topic.APPROVALS_DECIDED:
            decision = ApprovalDecision.model_validate_json(event.value or b"")
            step = await decide(state, decision, call_id, now)
            steps.append(step)
            state = step.state
        else:
            step = on_tick(state, now=now, rules=rules)
            steps.append(step)
            state = step.state
        return state, steps

    @app.agent(source, name=StreamStage.APPROVAL_JOIN)
    async def approval_join(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            position = SourcePosition(
                topic=message.topic, partition=message.partition, offset=message.offset
            )
            event_key = f"{position.topic}:{position.partition}:{position.offset}"
            started = time.time_ns()
            parent = traceparent_of(message.headers)
            before = table.get(event.key) if event.key else None
            try:
                handled = await handle(event, position)
            except (ValidationError, ValueError):
                letter = dead_letter(
                    event.value,
                    reason="approval-join: unreadable record",
                    call_id=None,
                    source=position,
                    at=datetime.now(UTC),
                    key=event.key.decode(errors="replace") if event.key else None,
                )
                hop = observer.finished(
                    Stage.APPROVE, (letter,), parent=parent, start_ns=started, end_ns=time.time_ns()
                )
                await publish((letter,), hop)
                continue
            if handled is None:
                continue  # committed by the authorizer, whose hop the call's trace went through
            state, steps = handled
            emits = tuple(e for s in steps for e in s.emits)
            audits = [a for s in steps for a in s.audits]
            # The audit comes first: a record whose audit could not be written is retried,
            # never published unrecorded.
            await retrying(
                partial(storage.audit, audits, event_key=event_key),
                retry_on=(StorageUnavailable,),
                what="audit storage",
            )
            ended = [e for s in steps for e in s.ended]
            if ended:  # before the outcomes: a later call of the operation is told the same
                await retrying(
                    partial(storage.end_requests, ended),
                    retry_on=(StorageUnavailable,),
                    what="approval requests",
                )
            call = state.authorized if state is not None else None
            trace_id = call.trace_id if call is not None else None
            stored = state.traceparent if state is not None else None
            if trace_id and stored and (parent is None or parent.trace_id != trace_id):
                # A decision or an expiry tick, in a trace of its own (or none): the call's
                # trace continues from the hop that asked for the approval.
                parent = parse_traceparent(stored)
            hop = observer.finished(
                Stage.APPROVE,
                emits,
                parent=parent,
                start_ns=started,
                end_ns=time.time_ns(),
                trace_id=trace_id,
            )
            await publish(emits, hop)
            if state is not None and call is not None and stored is None:
                state = state.model_copy(update={"traceparent": hop.decode()})
            after = state.model_dump_json().encode() if state is not None else None
            # Never a keyless table record: Kafka refuses it on a compacted changelog.
            if event.key and after != before:
                if after is None:
                    table.pop(event.key, None)
                else:
                    table[event.key] = after

    @app.timer(interval=TICK_EVERY)  # type: ignore[untyped-decorator]  # faust's is untyped
    async def nudge_due_approvals() -> None:
        now = datetime.now(UTC)
        clock = time.monotonic()
        for key, raw in list(table.items()):
            state = readable_state(raw)
            if state is None:
                continue
            if not due(state, now) or clock - ticked.get(state.call_id, 0.0) < RETICK_AFTER:
                continue
            ticked[state.call_id] = clock
            await topics[Topic.APPROVAL_TIMERS].send(
                key=key, value=json.dumps({"at": now.isoformat()}).encode()
            )
        for call_id, at in list(ticked.items()):
            if clock - at > 10 * RETICK_AFTER:
                del ticked[call_id]

    del approval_join, nudge_due_approvals  # registered with the app


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
