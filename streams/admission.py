"""Fleet admission at the first consumer of `calls.proposed` (the validator): a call over a
limit, or shed under load, ends at once ``rejected/rate_limited`` with ``retry_after``;
it is never authorized, executed or queued behind other tenants' calls.

Agents publish to Kafka directly, so admission cannot live in the client. The validator
decides a whole batch at once: its valid calls' verified context (the token cache makes
that a dictionary lookup for an agent's reused token), their buckets (commands/limits.py),
one Redis round trip per 100 calls (streams/limiter.py); a refusal is a small outcome
record. A call whose context does not verify draws from buckets of its own (per claimed
tenant and fleet-wide, settings ``admission.unverified_*``; commands/limits.py, Unverified):
refused ``rate_limited`` once they are empty, else passed on for the authorizer to refuse
``unauthenticated`` as before; an unverified claim never spends a verified tenant's budget.
Load shedding (the lag of the next stages' groups) refuses the lowest class first; fair
shares (streams/fair_share.py) shed the heaviest tenants while the stages queue, limits
declared or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from pydantic import BaseModel, PrivateAttr, TypeAdapter
from redis.exceptions import RedisError

from commands.catalog import Catalog
from commands.limits import (
    Bucket,
    CallScope,
    LimitSet,
    Priority,
    Shedding,
    Unverified,
    buckets_of,
    priority_of,
)
from commands.validate import Glance, Limits, glance
from config.settings import Settings
from runtime.clients import kafka_admin, kafka_consumer
from runtime.identity import ContextKeys, verify_context_token
from runtime.turns import turn
from schemas.envelopes import ErrorInfo, Outcome, ReplyAddress, Stage, Status, ValidatedCall
from schemas.errors import ErrorCode, Unauthenticated
from schemas.lanes import tenant_claim
from schemas.names import (
    ADMISSION_RELEASE_GROUP,
    AUTHORIZER_GROUP,
    EXECUTOR_GROUP,
    STREAMS_APP_ID,
    Topic,
)
from streams.emit import Emit, outcome
from streams.fair_share import FairShedder
from streams.limiter import ADMITTED, Ask, FleetLimiter, Verdict
from telemetry.tracing import trace_id_of

log = logging.getLogger("ratifier.admission")

# Calls decided per Lua call: a batch of 500 is two round trips, so that building one
# script call never holds the event loop long (other partitions' batches run in between),
# while each round trip's fixed cost (≈ 0.4 ms of the client's CPU) is shared by many calls.
ADMIT_CHUNK = 250
# Records glanced at before letting other partitions' batches run (≈ 10 µs each).
SCREEN_YIELD_EVERY = 50
# Buckets remembered per (tenant, agent, tool) while the limits in force stay the same.
BUCKETS_CACHED = 10_000

# The next stages whose backlog admission watches: (group, topic it reads).
DOWNSTREAM: tuple[tuple[str, Topic], ...] = (
    (AUTHORIZER_GROUP, Topic.VALIDATED),
    (STREAMS_APP_ID, Topic.AUTHORIZED),  # the approval-join
    (EXECUTOR_GROUP, Topic.COMMITTED),
)


class Refusable(Protocol):
    """What a refusal is built from: a validated call, or a proposal admission glanced at."""

    @property
    def call_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def context(self) -> str: ...
    @property
    def trace_id(self) -> str | None: ...
    @property
    def reply_to(self) -> ReplyAddress | None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Proposal:
    """A `calls.proposed` record admission judges before it is validated."""

    call_id: str
    tool: str
    context: str
    trace_id: str | None
    reply_to: ReplyAddress | None

    @classmethod
    def of(cls, seen: Glance, trace_id: str | None) -> Proposal:
        return cls(
            call_id=seen.call_id,
            tool=seen.tool,
            context=seen.context,
            trace_id=trace_id,
            reply_to=seen.reply_to,
        )


def scope_of(call: Refusable, catalog: Catalog, keys: ContextKeys) -> CallScope | None:
    """Who asks for what, from the verified context; None when it does not verify."""
    tool = catalog.get(call.tool)
    if tool is None:
        return None
    try:
        actor = verify_context_token(call.context, keys)
    except Unauthenticated:
        return None
    return CallScope(
        call_id=call.call_id,
        tenant=actor.tenant,
        agent=actor.sub,
        tool=tool.name,
        effect=tool.effect,
    )


def unverified_scope_of(call: Refusable, catalog: Catalog) -> CallScope | None:
    """Pure: the scope of a call whose context does not verify: its tenant is the token's
    unverified claim ("" when none is readable), for its forged-call buckets only; None when
    its tool is not in the catalog (validation refuses it)."""
    tool = catalog.get(call.tool)
    if tool is None:
        return None
    return CallScope(
        call_id=call.call_id,
        tenant=tenant_claim(call.context) or "",
        agent="",
        tool=tool.name,
        effect=tool.effect,
        verified=False,
    )


def owner_of(scope: CallScope) -> str | None:
    """The tenant an outcome names: none for a call whose context does not verify (as the
    authorizer's ``unauthenticated`` names none)."""
    return scope.tenant if scope.verified else None


def refused(
    call: Refusable,
    scope: CallScope,
    verdict: Verdict,
    *,
    now: datetime,
    policy_version: str | None,
) -> Emit:
    """The ``rate_limited`` outcome of a call admission refused."""
    message = (
        "The system is overloaded; retry the same call after retry_after."
        if verdict.reason in ("shed", "fair", "unavailable")
        else None
    )
    return outcome(
        call_id=call.call_id,
        tool=call.tool,
        tenant=owner_of(scope),
        status=Status.REJECTED,
        stage=Stage.VALIDATE,
        code=ErrorCode.RATE_LIMITED,
        at=now,
        policy_version=policy_version,
        trace_id=call.trace_id,
        error=ErrorInfo.of(ErrorCode.RATE_LIMITED, message, retry_after=verdict.retry_after),
        reply_to=call.reply_to,
    )


class Refusal(Outcome):
    """A ``rate_limited`` outcome copied from its kind's template (:class:`Refusals`), with
    its JSON stamped from the template's: the call's own values put between the template's
    bytes, not the whole record serialized again (a flood's refusals are most of what the
    validator publishes). The same bytes as ``Outcome.to_bytes`` (tests/unit/test_admission.py)."""

    _json: bytes | None = PrivateAttr(default=None)

    def to_bytes(self) -> bytes:
        # The private dict itself: ``self._json`` goes through pydantic's ``__getattr__``.
        stamped: bytes | None = (self.__pydantic_private__ or {}).get("_json")
        return stamped if stamped is not None else super().to_bytes()

    def with_call(self, values: dict[str, Any], stamped: bytes | None) -> Refusal:
        """A copy with ``values`` in place of the template's (:func:`_copied`) and its JSON
        ``stamped`` (None: serialized when sent)."""
        return _copied(self, values, {"_json": stamped})


M = TypeVar("M", bound=BaseModel)


def _copied(model: M, values: dict[str, Any], private: dict[str, Any] | None = None) -> M:
    """``model`` with ``values`` (fields already valid: a call's own, or values of the
    fields' types) in place of its own: what ``model_copy(update=...)`` does (it does not
    validate either), without its generic copying, which was a flood's largest cost after
    the limiter's (each refusal has a wait of its own)."""
    copy = model.__class__.__new__(model.__class__)
    fields = dict(model.__dict__)
    fields.update(values)
    object.__setattr__(copy, "__dict__", fields)
    object.__setattr__(
        copy, "__pydantic_fields_set__", model.__pydantic_fields_set__ | values.keys()
    )
    object.__setattr__(copy, "__pydantic_extra__", None)
    object.__setattr__(copy, "__pydantic_private__", private)
    return copy


# Placeholders in a template's JSON: each call's values go there.
_CALL_MARK = "@call_id@"
_TRACE_MARK = "@trace_id@"
_WAIT_MARK = 123456.789  # retry_after: a float, as the field holds one
_AT_MARK = datetime(1999, 9, 9, 9, 9, 9, 909090, tzinfo=UTC)  # at: when the batch was decided
# A datetime's JSON as the records' fields write it (a plain `datetime` field).
_DATETIME_JSON = TypeAdapter(datetime)


@dataclass(frozen=True)
class _Stamp:
    """A template's JSON cut at its placeholders: (bytes before, which value) ..., the end."""

    parts: tuple[tuple[bytes, str], ...]
    end: bytes

    @classmethod
    def of(cls, template: Outcome) -> _Stamp | None:
        if template.error is None:
            return None
        marked = template.model_copy(
            update={
                "call_id": _CALL_MARK,
                "trace_id": _TRACE_MARK,
                "reply_to": None,
                "at": _AT_MARK,
                "error": template.error.model_copy(update={"retry_after": _WAIT_MARK}),
            }
        ).to_bytes()
        marks = {
            "call_id": f'"call_id":"{_CALL_MARK}"'.encode(),
            "trace_id": f'"trace_id":"{_TRACE_MARK}"'.encode(),
            "retry_after": f'"retry_after":{_WAIT_MARK!r}'.encode(),
            "at": b'"at":' + _DATETIME_JSON.dump_json(_AT_MARK),
        }
        found = sorted((marked.find(mark), name, mark) for name, mark in marks.items())
        if any(at < 0 or marked.count(mark) != 1 for at, _, mark in found):
            return None
        parts, start = [], 0
        for at, name, mark in found:
            prefix = mark[: mark.index(b":") + 1]
            parts.append((marked[start:at] + prefix, name))
            start = at + len(mark)
        return cls(parts=tuple(parts), end=marked[start:])

    def json(
        self, call_id: str, trace_id: str | None, retry_after: float | None, at: bytes
    ) -> bytes | None:
        """The record's JSON with these values (``at``: the time's JSON); None when one is
        not written here as JSON would write it (an unusual wait, a trace id outside plain
        characters)."""
        if retry_after is not None and not 1e-4 <= retry_after < 1e15:
            return None
        if trace_id is not None and not trace_id.isalnum():
            return None
        values = {
            # A call id is of [A-Za-z0-9._:-] (CALL_ID_PATTERN): nothing to escape.
            "call_id": b'"' + call_id.encode() + b'"',
            "trace_id": b'"' + trace_id.encode() + b'"' if trace_id is not None else b"null",
            "retry_after": repr(retry_after).encode() if retry_after is not None else b"null",
            "at": at,
        }
        out = bytearray()
        for prefix, name in self.parts:
            out += prefix
            out += values[name]
        out += self.end
        return bytes(out)


# Kinds of refusal (tenant, tool, reason, policy version) whose template is kept.
TEMPLATES_KEPT = 1_000
Kind = tuple[str | None, str, str | None, str | None]
Templates = dict[Kind, tuple[Refusal, "_Stamp | None"]]


class Refusals:
    """:func:`refused` for the calls of one batch: the outcome of each kind of refusal
    (tenant, tool, reason, policy version) is built and validated once, in the first batch
    that needs it (``templates``, kept across batches), then copied with each call's own
    fields, which come validated from the call (``call_id``, ``trace_id``, ``reply_to``) or
    are a float ≥ 0 (``retry_after``) or the batch's time (``at``), as validation would store
    them: the same record as :func:`refused` gives (tests/unit/test_admission.py compares
    them). Building a template costs about a millisecond: once per batch, it was most of a
    small batch's cost."""

    def __init__(
        self, *, now: datetime, policy_version: str | None, templates: Templates | None = None
    ) -> None:
        self._now = now
        self._at = _DATETIME_JSON.dump_json(now)
        self._policy_version = policy_version
        self._built: Templates = templates if templates is not None else {}
        if len(self._built) >= TEMPLATES_KEPT:
            self._built.clear()
        # The error of each kind of refusal per advised wait (a batch's refusals share few).
        self._errors: dict[tuple[Kind, float | None], ErrorInfo] = {}

    def stamped(self, call: Refusable, scope: CallScope, verdict: Verdict) -> bytes | None:
        """The JSON of the outcome :meth:`of` gives, straight from its kind's template, when
        there is one and the call's values are stamped into it (None: :meth:`of` it is)."""
        after = verdict.retry_after
        if call.reply_to is not None or (after is not None and after < 0):
            return None
        built = self._built.get((owner_of(scope), call.tool, verdict.reason, self._policy_version))
        if built is None or built[1] is None or built[0].error is None:
            return None
        wait = float(after) if after is not None else None
        return built[1].json(call.call_id, call.trace_id, wait, self._at)

    def of(self, call: Refusable, scope: CallScope, verdict: Verdict) -> Emit:
        after = verdict.retry_after
        kind = (owner_of(scope), call.tool, verdict.reason, self._policy_version)
        built = self._built.get(kind)
        if built is None or built[0].error is None or (after is not None and after < 0):
            first = refused(
                call, scope, verdict, now=self._now, policy_version=self._policy_version
            )
            assert isinstance(first.value, Outcome)
            template = Refusal.model_validate(first.value.model_dump())
            self._built[kind] = (template, _Stamp.of(template))
            return first
        template, stamp = built
        assert template.error is not None
        wait = float(after) if after is not None else None
        error = self._errors.get((kind, wait))
        if error is None:
            error = self._errors[(kind, wait)] = _copied(template.error, {"retry_after": wait})
        value = template.with_call(
            {
                "call_id": call.call_id,
                "trace_id": call.trace_id,
                "reply_to": call.reply_to,
                "error": error,
                "at": self._now,
            },
            stamp.json(call.call_id, call.trace_id, wait, self._at)
            if stamp is not None and call.reply_to is None
            else None,
        )
        return Emit(topic=Topic.OUTCOMES, key=call.call_id, value=value)


def shed_verdicts(
    scopes: Sequence[CallScope], limits: LimitSet, shedding: Shedding | None
) -> list[Verdict | None]:
    """Pure: the calls shedding refuses (a verdict), the others None."""
    if shedding is None:
        return [None] * len(scopes)
    return [
        Verdict(admitted=False, retry_after=shedding.retry_after, reason="shed")
        if shedding.refuses(priority_of(limits, s))
        else None
        for s in scopes
    ]


def fair_verdicts(
    candidates: Sequence[tuple[int, Refusable, CallScope]],
    shed: list[Verdict | None],
    fair: FairShedder,
) -> list[Verdict | None]:
    """``shed`` with the verified calls that fair shares refuse (streams/fair_share.py) given
    their verdict too; a call shed by class is neither counted nor judged again."""
    refusal: Verdict | None = None
    out = list(shed)
    for n, (_, _, scope) in enumerate(candidates):
        if out[n] is not None or not scope.verified:
            continue
        if not fair.admits(scope.tenant):
            if refusal is None:
                wait = fair.settings.shed_retry_after_seconds
                refusal = Verdict(admitted=False, retry_after=wait, reason="fair")
            out[n] = refusal
    return out


@dataclass(frozen=True, slots=True)
class Stamped:
    """A refusal as its record's JSON (:meth:`Refusals.stamped`), for the validator to publish
    itself (runtime/bulk.py); ``emit`` builds its outcome when it must go the usual way."""

    call_id: str
    json: bytes
    emit: Callable[[], Emit]


@dataclass(frozen=True, kw_only=True)
class Screening:
    """What :meth:`Admission.screen` decided for a batch of proposals, by their index."""

    refusals: dict[int, tuple[Emit, ...]] = field(default_factory=dict)
    # Refusals as ready JSON (``screen(stamping=True)``), not in ``refusals``.
    stamped: dict[int, Stamped] = field(default_factory=dict)
    judged: frozenset[int] = frozenset()  # admitted or refused: not to be judged again


class Admission:
    """The validator's admission step: shared limiter, limits in force, shedding state."""

    def __init__(
        self,
        *,
        limiter: FleetLimiter,
        catalog: Catalog,
        keys: ContextKeys,
        limits: Callable[[], LimitSet],
        unverified: Unverified | None = None,
        fair: FairShedder | None = None,
    ) -> None:
        """``unverified``: the buckets of calls whose context does not verify (None: such
        calls are passed on unjudged, for the authorizer to refuse); ``fair``: fair shares
        (None: off)."""
        self.limiter = limiter
        self._unverified = unverified
        self.fair = fair
        self._catalog = catalog
        self._keys = keys
        self._limits = limits
        self.shedding: Shedding | None = None
        self.refusals = 0
        self._buckets: dict[tuple[str, str, str, bool], tuple[Bucket, ...]] = {}
        self._buckets_of: LimitSet | None = None  # the limits ``_buckets`` were found in
        self._templates: Templates = {}  # refusals' templates (Refusals), across batches

    def buckets(self, limits: LimitSet, scope: CallScope) -> tuple[Bucket, ...]:
        """:func:`buckets_of` (a verified call) or the unverified buckets of its claimed
        tenant, remembered per tenant, agent and tool (all it depends on but the limits, which
        replace the remembered ones when they change)."""
        if limits is not self._buckets_of or len(self._buckets) >= BUCKETS_CACHED:
            self._buckets, self._buckets_of = {}, limits
        who = (scope.tenant, scope.agent, scope.tool, scope.verified)
        found = self._buckets.get(who)
        if found is None:
            if scope.verified:
                found = buckets_of(limits, scope)
            else:
                assert self._unverified is not None
                found = self._unverified.buckets(scope.tenant)
            self._buckets[who] = found
        return found

    def _idle(self) -> bool:
        """Nothing to judge: no limits, no shedding, no unverified buckets, no fair shares
        (which count every verified call)."""
        return (
            self._limits().empty
            and self.shedding is None
            and self._unverified is None
            and self.fair is None
        )

    def _scope(self, call: Refusable) -> CallScope | None:
        """The call's scope, verified, else its unverified one when those are counted."""
        scope = scope_of(call, self._catalog, self._keys)
        if scope is None and self._unverified is not None:
            return unverified_scope_of(call, self._catalog)
        return scope

    def counts_slots(self) -> bool:
        """Whether a concurrency limit is in force (slots to release when calls end)."""
        return any(limit.concurrency is not None for limit in self._limits().limits)

    async def screen(
        self,
        proposals: Sequence[tuple[bytes | None, Any]],
        *,
        limits: Limits,
        now: datetime,
        policy_version: str | None,
        stamping: bool = False,
    ) -> Screening:
        """Judge ``proposals`` (each record's value and headers) before they are validated:
        those :func:`~commands.validate.glance` reads and whose context verifies are admitted
        or refused now, so that a flood's refusals cost neither validation nor a validated
        record each (docs/operations.md, "Fair admission"); the others are left to
        :meth:`admit` after validation. With ``stamping``, a refusal whose JSON can be
        stamped from its template is given as such (``Screening.stamped``)."""
        if self._idle():
            return Screening()
        candidates: list[tuple[int, Refusable, CallScope]] = []
        for index, (raw, headers) in enumerate(proposals):
            if index % SCREEN_YIELD_EVERY == SCREEN_YIELD_EVERY - 1:
                await turn()  # other partitions' batches run meanwhile
            seen = glance(raw, self._catalog, limits)
            if seen is None:
                continue
            proposal = Proposal.of(seen, trace_id=trace_id_of(headers))
            scope = self._scope(proposal)
            if scope is not None:
                candidates.append((index, proposal, scope))
        stamped: dict[int, Stamped] | None = {} if stamping else None
        refused = await self._judge(
            candidates, now=now, policy_version=policy_version, stamped=stamped
        )
        return Screening(
            refusals=refused,
            stamped=stamped or {},
            judged=frozenset(i for i, _, _ in candidates),
        )

    async def admit(
        self,
        results: Sequence[tuple[Emit, ...]],
        *,
        now: datetime,
        policy_version: str | None,
    ) -> list[tuple[Emit, ...]]:
        """``results`` (what the validator decided per record) with each valid call that is
        refused replaced by its ``rate_limited`` outcome."""
        if self._idle():
            return list(results)
        candidates: list[tuple[int, Refusable, CallScope]] = []
        for index, emits in enumerate(results):
            if len(emits) == 1 and isinstance(emits[0].value, ValidatedCall):
                call = emits[0].value
                scope = self._scope(call)
                if scope is not None:
                    candidates.append((index, call, scope))
        out = list(results)
        for index, emits in (
            await self._judge(candidates, now=now, policy_version=policy_version)
        ).items():
            out[index] = emits
        return out

    async def _judge(
        self,
        candidates: Sequence[tuple[int, Refusable, CallScope]],
        *,
        now: datetime,
        policy_version: str | None,
        stamped: dict[int, Stamped] | None = None,
    ) -> dict[int, tuple[Emit, ...]]:
        """The ``rate_limited`` outcome of each of ``candidates`` refused, by its index; with
        ``stamped``, those whose JSON is stamped go there instead."""
        if not candidates:
            return {}
        limits = self._limits()
        shed = shed_verdicts([s for _, _, s in candidates], limits, self.shedding)
        if self.fair is not None:
            shed = fair_verdicts(candidates, shed, self.fair)
        asks = [
            Ask(call=scope, buckets=self.buckets(limits, scope))
            for (_, _, scope), verdict in zip(candidates, shed, strict=True)
            if verdict is None
        ]
        verdicts: list[Verdict] = []
        for start in range(0, len(asks), ADMIT_CHUNK):
            verdicts += await self.limiter.admit(asks[start : start + ADMIT_CHUNK])
        counted = iter(verdicts)
        refusals = Refusals(now=now, policy_version=policy_version, templates=self._templates)
        out: dict[int, tuple[Emit, ...]] = {}
        for n, ((index, call, scope), verdict) in enumerate(zip(candidates, shed, strict=True)):
            if n % SCREEN_YIELD_EVERY == SCREEN_YIELD_EVERY - 1:
                await turn()  # a flood's batch builds its refusals in slices too
            final = verdict if verdict is not None else next(counted, ADMITTED)
            if final.admitted:
                continue
            if verdict is None and self.fair is not None and scope.verified:
                self.fair.refused_after(scope.tenant)  # by a limit: not admitted either
            self.refusals += 1
            ready = refusals.stamped(call, scope, final) if stamped is not None else None
            if stamped is not None and ready is not None:
                stamped[index] = Stamped(
                    call_id=call.call_id, json=ready, emit=partial(refusals.of, call, scope, final)
                )
            else:
                out[index] = (refusals.of(call, scope, final),)
        return out


async def downstream_lag(
    admin: AIOKafkaAdminClient, probe: AIOKafkaConsumer, settings: Settings
) -> int:
    """The largest backlog (records not yet committed) of the next stages' groups."""
    worst = 0
    for group, topic in DOWNSTREAM:
        committed = await admin.list_consumer_group_offsets(settings.group(group))
        name = settings.topic(topic)
        mine = {
            TopicPartition(tp.topic, tp.partition): m.offset
            for tp, m in committed.items()
            if tp.topic == name
        }
        if not mine:
            continue
        ends = await probe.end_offsets(list(mine))
        worst = max(worst, sum(max(0, ends[tp] - max(o, 0)) for tp, o in mine.items()))
    return worst


def shedding_for(settings: Settings, lag: int) -> Shedding | None:
    """Pure: the shedding state for a measured ``lag`` (None: nothing is shed)."""
    a = settings.admission
    if a.shed_bulk_lag == 0 and a.shed_all_lag == 0:
        return None
    bulk = a.shed_bulk_lag or a.shed_all_lag
    every = a.shed_all_lag or 10**12
    if lag <= min(bulk, every):
        return None
    return Shedding(
        lag=lag, bulk_bound=bulk, all_bound=every, retry_after=a.shed_retry_after_seconds
    )


async def watch_lag(settings: Settings, admission: Admission, stop: asyncio.Event) -> None:
    """Keep ``admission.shedding`` current from the downstream lag until ``stop``."""
    if settings.admission.shed_bulk_lag == 0 and settings.admission.shed_all_lag == 0:
        return
    period = settings.admission.lag_probe_seconds
    admin = kafka_admin(settings)
    probe = kafka_consumer(settings, group=None)
    started = False
    try:
        while not stop.is_set():
            try:
                if not started:
                    await admin.start()
                    await probe.start()
                    started = True
                lag = await downstream_lag(admin, probe, settings)
            except (KafkaError, OSError) as exc:
                log.info("admission: downstream lag not measured (%s)", exc)
            else:
                before, admission.shedding = admission.shedding, shedding_for(settings, lag)
                if (before is None) != (admission.shedding is None):
                    log.warning(
                        "admission: downstream lag %d; shedding %s",
                        lag,
                        "on" if admission.shedding else "off",
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
    finally:
        if started:
            await probe.stop()
            await admin.close()


def ended_call(raw: bytes | None) -> str | None:
    """The call id of an `outcomes` record that is final (not ``awaiting_approval``)."""
    try:
        record = json.loads(raw or b"")
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("status") == Status.AWAITING_APPROVAL.value:
        return None
    call_id = record.get("call_id")
    return call_id if isinstance(call_id, str) else None


async def release_slots(settings: Settings, admission: Admission, stop: asyncio.Event) -> None:
    """Free the concurrency slots of calls whose final outcome was published (a consumer
    group on `outcomes`; at least once, and releasing twice is harmless). A slot whose
    outcome is never seen expires after ``concurrency_lease_seconds``."""
    consumer = kafka_consumer(
        settings,
        settings.topic(Topic.OUTCOMES),
        group=settings.group(ADMISSION_RELEASE_GROUP),
        max_poll_records=1000,
        # A new group starts at the end: slots of calls that ended before it expire.
        auto_offset_reset="latest",
    )
    started = False
    try:
        while not stop.is_set():
            try:
                if not started:
                    await consumer.start()
                    started = True
                # Without a concurrency limit in force there is nothing to release: the
                # partitions are paused, so that this process does not fetch and decode every
                # outcome it publishes (one per refusal, in a flood); with one, reading goes on
                # from where it stopped (releasing what has nothing to release is harmless).
                counting = admission.counts_slots()
                assigned = consumer.assignment()
                if counting:
                    consumer.resume(*assigned)
                else:
                    consumer.pause(*assigned)
                batches = await consumer.getmany(timeout_ms=500)
                ended = [
                    c
                    for records in batches.values()
                    for r in records
                    if counting and (c := ended_call(r.value)) is not None
                ]
                if ended:
                    await admission.limiter.release(ended)
                if batches:
                    await consumer.commit()
            except (KafkaError, OSError, RedisError) as exc:
                log.info("admission: slots not released yet (%s)", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        if started:
            await consumer.stop()


__all__ = [
    "Admission",
    "Priority",
    "Refusals",
    "release_slots",
    "scope_of",
    "shedding_for",
    "unverified_scope_of",
    "watch_lag",
]
