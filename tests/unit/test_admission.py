"""Admission's pure parts: limits declared beside the policies, the buckets and class of a
call, shedding, the Lua script's arguments, the validator's refusals (with an in-memory
limiter), and what a refusal tells agents (client wait, model-facing text)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from commands.catalog import Catalog
from commands.limits import (
    NO_LIMITS,
    Bucket,
    CallScope,
    LimitSet,
    Priority,
    Shedding,
    buckets_of,
    describe,
    load_limit_file,
    parse_limits,
    priority_of,
)
from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from commands.validate import Limits, glance
from config.settings import Admission as AdmissionSettings
from config.settings import Settings
from ratifier_client.client import Pending, rate_limited_wait
from runtime.bulk import BulkRecord
from runtime.loop import SETTLED
from schemas.envelopes import Effect, ErrorInfo, Outcome, Stage, Status, ValidatedCall
from schemas.errors import ConfigurationError, ErrorCode
from schemas.names import Topic
from schemas.providers import result_text
from streams.admission import (
    Admission,
    Refusal,
    Refusals,
    Templates,
    refused,
    scope_of,
    shedding_for,
)
from streams.emit import Emit
from streams.limiter import ADMITTED, Ask, Verdict, script_arguments
from streams.stateless import validator_handler
from tests.unit.conftest import KEYS, token
from tests.unit.test_envelope import envelope
from tests.unit.test_stages import validated

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)

LIMITS = parse_limits(
    {
        "limits": [
            {"scope": "tenant", "rate": 200, "burst": 400},
            {"scope": "tenant", "tenant": "tenant-b", "rate": 50},
            {"scope": "agent", "rate": 20},
            {"scope": "tool", "tool": "refund_payment", "rate": 100, "concurrency": 10},
            {"scope": "tenant_tool", "tool": "get_payment", "concurrency": 5},
        ],
        "classes": [{"priority": "bulk", "agent": "batch-job"}],
    },
    source="test",
)


def _scope(tenant: str = "tenant-a", tool: str = "get_payment", agent: str = "bot") -> CallScope:
    return CallScope(call_id="c-1", tenant=tenant, agent=agent, tool=tool, effect=Effect.READ)


def test_a_tenant_rule_replaces_the_default_and_each_scope_has_its_key() -> None:
    a = {b.key: b for b in buckets_of(LIMITS, _scope())}
    assert a == {
        "tenant:tenant-a": Bucket(key="tenant:tenant-a", rate=200, capacity=400, concurrency=None),
        "agent:tenant-a:bot": Bucket(
            key="agent:tenant-a:bot", rate=20, capacity=20, concurrency=None
        ),
        "tenant_tool:tenant-a:get_payment": Bucket(
            key="tenant_tool:tenant-a:get_payment", rate=None, capacity=0, concurrency=5
        ),
    }
    b = {k.key: k for k in buckets_of(LIMITS, _scope(tenant="tenant-b", tool="refund_payment"))}
    assert b["tenant:tenant-b"].rate == 50
    assert b["tool:refund_payment"].concurrency == 10  # one bucket for the tool, all tenants
    assert "tenant_tool:tenant-b:refund_payment" not in b
    assert buckets_of(NO_LIMITS, _scope()) == ()


@pytest.mark.parametrize(
    "rule",
    [
        {"scope": "tenant"},  # neither rate nor concurrency
        {"scope": "tool", "rate": 1},  # a tool scope without its tool
        {"scope": "tenant", "tool": "x", "rate": 1},
        {"scope": "tenant", "burst": 5, "concurrency": 1},
        {"scope": "tenant", "rate": 0},
        {"scope": "planet", "rate": 1},
    ],
)
def test_a_bad_rule_is_a_configuration_error(rule: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        parse_limits({"limits": [rule]}, source="test")


def test_classes_and_shedding_refuse_the_lowest_class_first() -> None:
    assert priority_of(LIMITS, _scope()) is Priority.INTERACTIVE
    assert priority_of(LIMITS, _scope(agent="batch-job")) is Priority.BULK
    mid = Shedding(lag=500, bulk_bound=100, all_bound=1000, retry_after=2)
    assert mid.refuses(Priority.BULK) and not mid.refuses(Priority.INTERACTIVE)
    high = Shedding(lag=5000, bulk_bound=100, all_bound=1000, retry_after=2)
    assert high.refuses(Priority.INTERACTIVE)
    settings = Settings(admission=AdmissionSettings(shed_bulk_lag=100, shed_all_lag=1000))
    assert shedding_for(settings, 100) is None
    assert shedding_for(settings, 101) == Shedding(
        lag=101, bulk_bound=100, all_bound=1000, retry_after=2.0
    )
    off = Settings(admission=AdmissionSettings(shed_bulk_lag=0, shed_all_lag=0))
    assert shedding_for(off, 10**9) is None


def test_limits_travel_with_the_policy_set_and_change_its_version(tmp_path: Path) -> None:
    plain = PolicySet.from_directory(DEFAULT_POLICY_DIR)
    for f in DEFAULT_POLICY_DIR.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "limits.toml").write_text(
        '[[limits]]\nscope = "tenant"\nrate = 200\nburst = 400\n', encoding="utf-8"
    )
    limited = PolicySet.from_directory(tmp_path)
    assert limited.limits == load_limit_file(tmp_path)
    assert limited.limits.limits[0].rate == 200
    assert limited.version != plain.version
    assert plain.limits.empty  # a set without limits keeps the version it always had
    assert describe(limited.limits) == [
        "tenant                           every tenant     200/s burst 400"
    ]
    (tmp_path / "limits.toml").write_text("[[limits]]\nscope = 3\n", encoding="utf-8")
    with pytest.raises(ConfigurationError):
        PolicySet.from_directory(tmp_path)


def test_the_script_gets_each_bucket_once_and_each_call_its_indexes() -> None:
    shared = Bucket(key="tenant:t", rate=10, capacity=20, concurrency=3)
    asks = [
        Ask(
            call=CallScope(call_id=f"c-{i}", tenant="t", agent="a", tool="x", effect=Effect.READ),
            buckets=(shared,),
        )
        for i in range(2)
    ]
    keys, argv = script_arguments(asks, prefix="p.", settings=AdmissionSettings())
    assert keys == ["ratifier:limit:p.tenant:t:r", "ratifier:limit:p.tenant:t:c"]
    # One run of two calls drawing from buckets 1 and 2; the ids in one string.
    assert argv == [
        2, 60.0, 300, "ratifier:slots:p.", "-", 1.0, "r", 10, 20, "c", 3, 3, "2 2 1 2", "c-0 c-1"
    ]  # fmt: skip


def test_calls_drawing_from_other_buckets_start_a_new_run_in_order() -> None:
    a = Bucket(key="tenant:a", rate=10, capacity=20, concurrency=None)
    b = Bucket(key="tenant:b", rate=5, capacity=5, concurrency=None)

    def ask(call_id: str, *buckets: Bucket) -> Ask:
        scope = CallScope(call_id=call_id, tenant="t", agent="x", tool="y", effect=Effect.READ)
        return Ask(call=scope, buckets=buckets)

    asks = [ask("c-0", a), ask("c-1", a), ask("c-2", b), ask("c-3", a, b), ask("c-4", b)]
    keys, argv = script_arguments(asks, prefix="", settings=AdmissionSettings())
    assert keys == ["ratifier:limit:tenant:a:r", "ratifier:limit:tenant:b:r"]
    # (count, m, indexes) per run: c-0 and c-1 on bucket 1, c-2 on 2, c-3 on both, c-4 on 2.
    assert argv[-2:] == ["2 1 1 1 1 2 1 2 1 2 1 1 2", "c-0 c-1 c-2 c-3 c-4"]


class MemoryLimiter:
    """Admits the first ``room`` calls that have buckets, refuses the rest."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.asked: list[Ask] = []

    async def admit(self, asks: Sequence[Ask]) -> list[Verdict]:
        self.asked += asks
        verdicts = []
        for ask in asks:
            if not ask.buckets:
                verdicts.append(ADMITTED)
            elif self.room > 0:
                self.room -= 1
                verdicts.append(ADMITTED)
            else:
                verdicts.append(Verdict(admitted=False, retry_after=0.25, reason="limit"))
        return verdicts


def _admission(catalog: Catalog, limits: LimitSet, room: int) -> tuple[Admission, MemoryLimiter]:
    limiter = MemoryLimiter(room)
    admission = Admission(limiter=limiter, catalog=catalog, keys=KEYS, limits=lambda: limits)  # type: ignore[arg-type]
    return admission, limiter


def _validated(
    call_id: str, tenant: str = "tenant-a", context: str | None = None
) -> tuple[Emit, ...]:
    from schemas.names import Topic

    value = validated(tenant=tenant, call_id=call_id)
    if context is not None:
        value = value.model_copy(update={"context": context})
    return (Emit(topic=Topic.VALIDATED, key=call_id, value=value),)


async def test_calls_over_the_limit_end_rate_limited_at_once(catalog: Catalog) -> None:
    admission, limiter = _admission(catalog, LIMITS, room=1)
    decided = [_validated("c-1"), _validated("c-2"), _validated("c-3", context="not-a-token")]
    out = await admission.admit(decided, now=NOW, policy_version="sha256:x")
    assert out[0] == decided[0]
    (refusal,) = out[1]
    assert isinstance(refusal.value, Outcome)
    assert refusal.value.status is Status.REJECTED and refusal.value.stage is Stage.VALIDATE
    assert refusal.value.tenant == "tenant-a"  # from the verified context
    assert refusal.value.error == ErrorInfo.of(ErrorCode.RATE_LIMITED, retry_after=0.25)
    assert refusal.value.error.retryable
    # A context that does not verify spends no one's budget: the authorizer refuses it.
    assert out[2] == decided[2]
    assert [a.call.call_id for a in limiter.asked] == ["c-1", "c-2"]


async def test_without_limits_or_shedding_admission_does_nothing(catalog: Catalog) -> None:
    admission, limiter = _admission(catalog, NO_LIMITS, room=0)
    decided = [_validated("c-1")]
    assert await admission.admit(decided, now=NOW, policy_version=None) == decided
    assert limiter.asked == []


async def test_shedding_refuses_bulk_without_asking_redis(catalog: Catalog) -> None:
    bulk = parse_limits({"classes": [{"priority": "bulk", "tenant": "tenant-a"}]}, source="t")
    admission, limiter = _admission(catalog, bulk, room=10)
    admission.shedding = Shedding(lag=500, bulk_bound=100, all_bound=1000, retry_after=2.0)
    out = await admission.admit(
        [_validated("c-1"), _validated("c-2", tenant="tenant-b")], now=NOW, policy_version=None
    )
    refused = out[0][0].value
    assert isinstance(refused, Outcome) and refused.error is not None
    assert refused.error.code is ErrorCode.RATE_LIMITED and refused.error.retry_after == 2.0
    assert isinstance(out[1][0].value, ValidatedCall)  # tenant-b is interactive
    assert [a.call.call_id for a in limiter.asked] == ["c-2"]


def test_a_batch_s_refusals_are_the_records_refused_builds_one_by_one(catalog: Catalog) -> None:
    refusals = Refusals(now=NOW, policy_version="sha256:x")
    calls = [
        validated(call_id="c-1", trace_id="a" * 32),
        validated(call_id="c-2", reply_to={"topic": "ratifier.replies.agent-7", "partition": 2}),
        validated(call_id="c-3", trace_id="b" * 32),
        validated(call_id="c-4", tool="get_refund_policy", arguments={}),
        validated(call_id="c-5", tenant="tenant-b"),
    ]
    verdicts = [
        Verdict(admitted=False, retry_after=0.001, reason="limit"),
        Verdict(admitted=False, retry_after=2.5, reason="limit"),
        Verdict(admitted=False, retry_after=3, reason="shed"),  # an int, as a setting may be
        Verdict(admitted=False, retry_after=None, reason="unavailable"),
        Verdict(admitted=False, retry_after=0.5, reason="limit"),
    ]
    stamped = []
    for call, verdict in zip(calls * 2, verdicts * 2, strict=True):
        scope = scope_of(call, catalog, KEYS)
        assert scope is not None
        got = refusals.of(call, scope, verdict)
        one = refused(call, scope, verdict, now=NOW, policy_version="sha256:x")
        assert (got.topic, got.key) == (one.topic, one.key)
        assert got.value.to_bytes() == one.value.to_bytes()
        assert got.value.model_dump() == one.value.model_dump()
        stamped.append(isinstance(got.value, Refusal) and got.value._json is not None)
    # Copies after the first of each kind have their JSON stamped, but the one with a reply
    # address (serialized as any record).
    assert stamped == [False, False, False, False, False, True, False, True, True, True]


def _outcome(code: ErrorCode, retry_after: float | None) -> Outcome:
    return Outcome(
        call_id="c-1",
        tool="get_payment",
        tenant="tenant-a",
        status=Status.REJECTED,
        stage=Stage.VALIDATE,
        error=ErrorInfo.of(code, retry_after=retry_after),
        at=NOW,
    )


def test_the_client_waits_retry_after_on_rate_limited_only() -> None:
    assert rate_limited_wait(_outcome(ErrorCode.RATE_LIMITED, 1.5)) == 1.5
    assert rate_limited_wait(_outcome(ErrorCode.RATE_LIMITED, None)) == 1.0
    assert rate_limited_wait(_outcome(ErrorCode.POLICY_DENIED, None)) is None
    assert rate_limited_wait(Pending(call_id="c-1", status=None, approval=None)) is None


def test_the_model_reads_when_to_retry() -> None:
    text = result_text(_outcome(ErrorCode.RATE_LIMITED, 1.5))
    assert '"code":"rate_limited"' in text and '"retry_after":1.5' in text
    assert "retry_after" not in result_text(_outcome(ErrorCode.POLICY_DENIED, None))


def test_the_bench_report_judges_admission_cost_and_the_noisy_neighbour() -> None:
    from bench.report import _admission_section

    values: dict[str, Any] = {
        "admission_plain_cpu_us": 43.0,
        "admission_admitted_cpu_us": 51.0,
        "admission_refused_cpu_us": 73.0,
        "admission_cost_admitted_us": 8.0,
        "admission_cost_refused_us": 30.0,
        "e2e_cpu_us": 1167.0,
        "run_id": "run-1",
        "flood": {
            "run_id": "run-1",
            "flood": 2000,
            "b_alone_p50_ms": 74.0,
            "b_flood_p50_ms": 740.0,
        },
    }
    lines = _admission_section(values)
    cost = next(line for line in lines if "per admitted call" in line)
    noisy = next(line for line in lines if "noisy neighbour" in line)
    assert "**met**" in cost and "**not met**" in noisy and "10.00" in noisy
    # Figures another run left behind are not this run's: no verdict on them.
    stale = {**values, "flood": {**values["flood"], "run_id": "run-0"}}
    noisy = next(line for line in _admission_section(stale) if "noisy neighbour" in line)
    assert "not measured in this run" in noisy and "met**" not in noisy
    assert _admission_section({}) == []  # a run without the step has no section


def test_the_audit_story_says_what_a_rate_limited_outcome_means() -> None:
    from audit.story import _outcome as story_of

    stage, text, facts, _rank = story_of(
        _outcome(ErrorCode.RATE_LIMITED, 1.5).model_dump(mode="json")
    )
    assert stage == "validator" and text == "outcome: rejected (rate_limited)"
    assert any(k == "meaning" and "nothing was executed or queued" in v for k, v in facts)


def _proposed(**fields: Any) -> bytes:
    """A proposal of tenant-a with a context that verifies (``...`` drops a field)."""
    return envelope(**{"context": token(tenant="tenant-a"), **fields})


def test_admission_glances_at_a_plain_native_call_only(catalog: Catalog) -> None:
    limits = Limits()
    seen = glance(_proposed(), catalog, limits)
    assert seen is not None
    assert (seen.call_id, seen.tool, seen.reply_to) == ("c-1", "get_payment", None)
    address = {"topic": "ratifier.replies.agent-7", "partition": 1}
    replied = glance(_proposed(reply_to=address), catalog, limits)
    assert replied is not None and replied.reply_to is not None
    assert replied.reply_to.topic == "ratifier.replies.agent-7"
    # Anything else is validated first (and admitted after): parse_envelope judges it.
    for raw in [
        None,
        b"not json",
        b"[1, 2]",
        _proposed(v=2),
        _proposed(surprise=1),
        _proposed(format="openai", tool=..., arguments=..., call={"function": {}}),
        _proposed(call_id="c 1"),
        _proposed(call_id=7),
        _proposed(context=""),
        _proposed(context=...),
        _proposed(tool="no_such_tool"),
        _proposed(reply_to={"topic": "outcomes"}),
        _proposed(reply_to={"topic": "ratifier.replies.x", "partition": -1}),
        b"x" * (limits.max_record_bytes + 1),
    ]:
        assert glance(raw, catalog, limits) is None, raw


def _kind(value: object) -> str:
    if isinstance(value, Outcome) and value.error is not None:
        return f"Outcome:{value.error.code.value}"
    return type(value).__name__


class _Feed:
    def __init__(self, policies: PolicySet) -> None:
        self.current = policies


def _consumed(raw: bytes, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("calls.proposed", 0, offset, 0, 0, b"k", raw, None, 1, len(raw), [])


async def test_the_validator_refuses_a_flood_before_validating_it(
    catalog: Catalog, policies: PolicySet
) -> None:
    admission, limiter = _admission(catalog, LIMITS, room=1)
    handle = validator_handler(
        catalog=catalog,
        limits=Limits(),
        feed=_Feed(policies),  # type: ignore[arg-type]
        admission=admission,
    )
    records = [
        _consumed(_proposed(call_id="c-1"), 0),  # glanced at, admitted, validated
        # glanced at and refused: its arguments are never validated (rate limited first)
        _consumed(_proposed(call_id="c-2", arguments={"payment_id": 7}), 1),
        # not glanced at (another format): validated first, then judged
        _consumed(
            _proposed(
                call_id="c-3",
                format="anthropic",
                tool=...,
                arguments=...,
                call={"name": "get_payment", "input": {"payment_id": "pay_A1001"}},
            ),
            2,
        ),
        _consumed(_proposed(call_id="c-4"), 3),  # glanced at, refused
        _consumed(b"not json", 4),  # dead-lettered as before, never judged
    ]
    handled = await handle(records)
    assert [a.call.call_id for a in limiter.asked] == ["c-1", "c-2", "c-4", "c-3"]
    kinds = [_kind(h.emits[-1].value) for h in handled]
    assert kinds == [
        "ValidatedCall",
        "Outcome:rate_limited",
        "Outcome:rate_limited",  # c-3: the limiter's room was spent by then
        "Outcome:rate_limited",
        "DeadLetter",
    ]
    # Refusals go out through the bulk producer; the rest through the main one.
    assert [h.bulk for h in handled] == [False, True, True, True, False]
    refusal = handled[1].emits[0].value
    assert isinstance(refusal, Outcome) and refusal.tenant == "tenant-a"
    assert refusal.tool == "get_payment" and refusal.call_id == "c-2"


def test_refusals_of_later_batches_reuse_the_templates_with_their_own_time(
    catalog: Catalog,
) -> None:
    """Templates are kept across batches (``templates``): a later batch's refusals are
    stamped from them at once, with that batch's own time, and are the records ``refused``
    builds then."""
    templates: Templates = {}
    call = validated(call_id="c-1", trace_id="a" * 32)
    scope = scope_of(call, catalog, KEYS)
    assert scope is not None
    verdict = Verdict(admitted=False, retry_after=0.25, reason="limit")
    later = NOW + timedelta(seconds=3, microseconds=123)
    on_the_hour = NOW.replace(minute=0, second=0, microsecond=0)
    for at in (NOW, later, on_the_hour):
        got = Refusals(now=at, policy_version="sha256:x", templates=templates).of(
            call, scope, verdict
        )
        one = refused(call, scope, verdict, now=at, policy_version="sha256:x")
        assert got.value.to_bytes() == one.value.to_bytes()
        assert got.value.model_dump() == one.value.model_dump()
        stamped = isinstance(got.value, Refusal) and got.value._json is not None
        assert stamped is (at is not NOW)  # built once, in the first batch
    assert len(templates) == 1
    # Another policy version is another template.
    Refusals(now=later, policy_version="sha256:y", templates=templates).of(call, scope, verdict)
    assert len(templates) == 2


class _Published:
    """A stand-in for runtime/bulk.py's publisher: records what is sent; the records of
    ``lost`` call ids are not acknowledged."""

    def __init__(self, lost: frozenset[str] = frozenset()) -> None:
        self.sent: list[BulkRecord] = []
        self._lost = lost

    async def send(self, records: Sequence[BulkRecord]) -> _Published:
        self.sent += records
        self._last = list(records)
        return self

    async def acknowledged(self) -> list[bool]:
        return [r.key not in self._lost for r in self._last]


async def test_the_validator_publishes_stamped_refusals_itself(
    catalog: Catalog, policies: PolicySet
) -> None:
    admission, _ = _admission(catalog, LIMITS, room=1)
    published = _Published(lost=frozenset({"c-4"}))
    handle = validator_handler(
        catalog=catalog,
        limits=Limits(),
        feed=_Feed(policies),  # type: ignore[arg-type]
        admission=admission,
        bulk=lambda: published,  # type: ignore[arg-type, return-value]
    )
    ids = [f"c-{n}" for n in range(1, 6)]
    handled = await handle([_consumed(_proposed(call_id=c), n) for n, c in enumerate(ids)])
    # c-1 admitted; c-2 refused first of its kind (its template is built: the loop publishes
    # it); c-3 and c-5 stamped and acknowledged: settled; c-4 stamped but not acknowledged:
    # handed to the loop as its outcome.
    assert isinstance(handled[0].emits[0].value, ValidatedCall)
    assert handled[1].bulk and _kind(handled[1].emits[0].value) == "Outcome:rate_limited"
    assert handled[2] is SETTLED and handled[4] is SETTLED
    assert handled[3].bulk and not handled[3].settled
    assert [r.key for r in published.sent] == ["c-3", "c-4", "c-5"]
    assert {r.topic for r in published.sent} == {Topic.OUTCOMES}
    # The JSON sent is the outcome's as the loop would have published it.
    (again,) = handled[3].emits
    assert published.sent[1].value == again.value.to_bytes()
    outcome = Outcome.model_validate_json(published.sent[0].value)
    assert outcome.call_id == "c-3" and outcome.error is not None
    assert outcome.error.code is ErrorCode.RATE_LIMITED and outcome.tenant == "tenant-a"
