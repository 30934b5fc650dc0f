"""Reply routing (v1.3): the pure routing decision, the validator's refusal of a foreign reply
address, the address carried through every stage that ends a call, and the runtime loop
sending reply copies best-effort."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import TopicPartition

from commands.catalog import Catalog
from commands.policy import PolicySet
from commands.validate import Limits, Malformed, parse_envelope
from config.settings import Settings
from executors.reconciliation import WaitingCall, readdressed, waiting_calls
from ratifier_client.client import RatifierClient
from runtime.emit import Emit
from runtime.loop import ConsumerLoop, Handled, consumer_loop, failed, reply_to_in
from runtime.replies import ReplySender, reply_copies
from schemas.envelopes import (
    ApprovalRequest,
    AuthorizedCall,
    CommittedCommand,
    Outcome,
    ReplyAddress,
    SourcePosition,
    Stage,
    Status,
    ValidatedCall,
)
from schemas.errors import ErrorCode
from schemas.names import REPLY_OF_HEADER, Topic
from streams.approval import Rules, on_authorized
from streams.authorizer import on_validated
from streams.validator import on_proposed
from tests.unit.conftest import KEYS, NOW, SIGNING
from tests.unit.test_stages import PAYMENT, FakeStore, proposed, validated

NAMESPACE = "ratifier.replies."
MINE = ReplyAddress(topic="ratifier.replies.agent-7")
SOURCE = SourcePosition(topic="ratifier.calls.proposed", partition=0, offset=1)


def outcome(call_id: str = "c-1", reply_to: ReplyAddress | None = MINE) -> Outcome:
    return Outcome(
        call_id=call_id,
        tool="get_payment",
        tenant="tenant-a",
        status=Status.SUCCEEDED,
        stage=Stage.EXECUTE,
        result={"ok": True},
        at=NOW,
        reply_to=reply_to,
    )


def test_reply_copies_of_outcomes_and_requests_under_the_namespace_only() -> None:
    shared = ReplyAddress(topic="ratifier.replies.fleet", partition=3)
    emits = (
        Emit(topic=Topic.OUTCOMES, key="c-1", value=outcome("c-1")),
        Emit(topic=Topic.OUTCOMES, key="c-2", value=outcome("c-2", reply_to=None)),
        Emit(topic=Topic.OUTCOMES, key="c-3", value=outcome("c-3", reply_to=shared)),
        # A foreign address reaching a publisher anyway is not honoured.
        Emit(
            topic=Topic.OUTCOMES,
            key="c-4",
            value=outcome("c-4", reply_to=ReplyAddress(topic="ratifier.outcomes")),
        ),
        Emit(topic=Topic.DEADLETTER, key="c-1", value=outcome("c-1")),
    )
    copies = reply_copies(emits, NAMESPACE)
    assert [(c.topic, c.partition, c.key, c.of) for c in copies] == [
        ("ratifier.replies.agent-7", None, "c-1", Topic.OUTCOMES),
        ("ratifier.replies.fleet", 3, "c-3", Topic.OUTCOMES),
    ]
    assert copies[0].value == emits[0].value
    assert reply_copies(emits, "") == ()  # no namespace: nothing is honoured
    assert not ReplyAddress(topic=NAMESPACE).under(NAMESPACE)  # the namespace itself is not one


def test_reply_address_is_bounded() -> None:
    for body in (
        {"topic": "x" * 250},
        {"topic": "ratifier.replies.a b"},
        {"topic": "ratifier.replies.a", "partition": 5000},
        {"topic": "ratifier.replies.a", "partition": -1},
        {"topic": "ratifier.replies.a", "extra": 1},
    ):
        parsed = parse_envelope(proposed(reply_to=body), Limits())
        assert isinstance(parsed, Malformed), body
        assert parsed.reason.startswith("invalid envelope field reply_to"), parsed.reason


def test_validator_refuses_a_reply_address_outside_the_namespace(catalog: Catalog) -> None:
    (refused,) = on_proposed(
        proposed(reply_to={"topic": "ratifier.commands.committed"}),
        source=SOURCE,
        catalog=catalog,
        limits=Limits(reply_namespace=NAMESPACE),
        now=NOW,
        trace_id=None,
    )
    assert isinstance(refused.value, Outcome)
    assert refused.value.status is Status.REJECTED
    assert refused.value.error is not None
    assert refused.value.error.code is ErrorCode.INVALID_REPLY_ADDRESS
    assert refused.value.error.fields[0].path == "$.reply_to.topic"
    assert refused.value.reply_to is None  # its refusal is not sent there either
    assert reply_copies((refused,), NAMESPACE) == ()


def test_validator_carries_the_address_and_honours_it_for_rejections(catalog: Catalog) -> None:
    mine = MINE.model_dump()
    (passed,) = on_proposed(
        proposed(reply_to=mine),
        source=SOURCE,
        catalog=catalog,
        limits=Limits(reply_namespace=NAMESPACE),
        now=NOW,
        trace_id=None,
    )
    assert isinstance(passed.value, ValidatedCall)
    assert passed.value.reply_to == MINE
    (rejected,) = on_proposed(
        proposed(reply_to=mine, tool="no_such_tool"),
        source=SOURCE,
        catalog=catalog,
        limits=Limits(reply_namespace=NAMESPACE),
        now=NOW,
        trace_id=None,
    )
    assert isinstance(rejected.value, Outcome)
    assert rejected.value.error is not None
    assert rejected.value.error.code is ErrorCode.UNKNOWN_TOOL
    assert [c.topic for c in reply_copies((rejected,), NAMESPACE)] == [MINE.topic]


async def test_every_later_stage_carries_the_address(catalog: Catalog, policies: PolicySet) -> None:
    store = FakeStore(PAYMENT)
    (denied,) = await on_validated(
        validated(tenant="tenant-b", reply_to=MINE),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=store.fetch,
        now=NOW,
    )
    assert isinstance(denied.value, Outcome) and denied.value.status is Status.DENIED
    assert denied.value.reply_to == MINE
    (committed,) = await on_validated(
        validated(reply_to=MINE),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=store.fetch,
        now=NOW,
    )
    assert isinstance(committed.value, CommittedCommand) and committed.value.reply_to == MINE
    (refund,) = await on_validated(
        validated(
            roles=("refund",),
            tool="propose_refund",
            arguments={"payment_id": "pay_A1001", "amount_minor": 100, "reason": "r"},
            reply_to=MINE,
        ),
        catalog=catalog,
        keys=KEYS,
        policies=policies,
        fetch=store.fetch,
        now=NOW,
    )
    assert isinstance(refund.value, AuthorizedCall)
    emits = on_authorized(
        None, refund.value, tool=catalog.get(refund.value.tool), now=NOW, rules=Rules(keys=SIGNING)
    ).emits
    request, waiting = emits
    assert isinstance(request.value, ApprovalRequest) and request.value.reply_to == MINE
    assert isinstance(waiting.value, Outcome) and waiting.value.reply_to == MINE
    copies = reply_copies(emits, NAMESPACE)
    assert [c.of for c in copies] == [Topic.APPROVALS_REQUESTED, Topic.OUTCOMES]


def test_a_generic_failure_outcome_keeps_the_address() -> None:
    emits = failed(
        b"{}", reason="x", source=SOURCE, stage=Stage.EXECUTE, call_id="c-9", reply_to=MINE
    )
    assert [c.key for c in reply_copies(emits, NAMESPACE)] == ["c-9"]
    kept = failed(b"{}", reason="x", source=SOURCE, stage=Stage.EXECUTE, replaces=outcome("c-8"))
    assert [c.key for c in reply_copies(kept, NAMESPACE)] == ["c-8"]


def test_a_settled_outcome_goes_to_each_waiting_calls_own_address() -> None:
    other = ReplyAddress(topic="ratifier.replies.agent-8")
    row = {
        "call_id": "c-first",
        "operation_id": "tenant-a:k",
        "outcome": {"call_id": "c-first", "trace_id": "t", "reply_to": MINE.model_dump()},
    }
    calls = waiting_calls(row, [WaitingCall(call_id="c-retry", trace_id=None, reply_to=other)])
    owed = readdressed(outcome("c-first", reply_to=None), calls)
    assert [(o.call_id, o.reply_to) for o in owed] == [("c-first", MINE), ("c-retry", other)]


# -- the runtime loop sends reply copies, best-effort -----------------------------------------


class Producer:
    def __init__(self, refuse_topic: str | None = None) -> None:
        self.sent: list[tuple[str, int | None, bytes | None, dict[str, bytes]]] = []
        self.refuse_topic = refuse_topic
        self.attempts: list[str] = []

    async def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes,
        headers: Any,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        self.attempts.append(topic)
        if topic == self.refuse_topic:
            await asyncio.sleep(10)  # a topic the broker does not know: metadata never comes
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, partition, key, dict(headers)))
        future.set_result(None)
        return future


class Consumer:
    def __init__(self, loop_holder: list[ConsumerLoop]) -> None:
        self.holder = loop_holder
        self.committed: list[Any] = []

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        self.holder[0].stop()
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set()


async def test_the_loop_publishes_reply_copies_and_skips_an_unreachable_reply_topic() -> None:
    settings = Settings(topic_prefix="u.", replies={"send_timeout_seconds": 0.05})
    unreachable = ReplyAddress(topic="u.replies.gone")
    mine = ReplyAddress(topic="u.replies.agent-7", partition=0)
    producer = Producer(refuse_topic=unreachable.topic)
    holder: list[ConsumerLoop] = []
    loop = consumer_loop(
        settings,
        Consumer(holder),
        producer,
        stage="execute",
        group="g",
        handle=_never,
        answers=Stage.EXECUTE,
    )
    holder.append(loop)
    results = [
        Handled(emits=(Emit(topic=Topic.OUTCOMES, key="c-1", value=outcome("c-1", mine)),)),
        Handled(emits=(Emit(topic=Topic.OUTCOMES, key="c-2", value=outcome("c-2", unreachable)),)),
        Handled(emits=(Emit(topic=Topic.OUTCOMES, key="c-3", value=outcome("c-3", unreachable)),)),
        Handled(failure="cannot handle", call_id="c-4", reply_to=mine),
    ]
    await loop.publish([(None, h) for h in results], 0)
    outcomes = [s for s in producer.sent if s[0] == "u.outcomes"]
    assert sorted(k for _t, _p, k, _h in outcomes if k) == [b"c-1", b"c-2", b"c-3", b"c-4"]
    replies = [s for s in producer.sent if s[0] == mine.topic]
    assert [(p, k) for _t, p, k, _h in replies] == [(0, b"c-1"), (0, b"c-4")]
    assert all(h[REPLY_OF_HEADER] == b"outcomes" for _t, _p, _k, h in replies)
    # The unreachable reply topic cost one bounded wait, then was skipped for c-3.
    assert producer.attempts.count(unreachable.topic) == 1


async def _never(records: Sequence[Any]) -> list[Handled]:
    raise AssertionError("not polled")


async def test_reply_sender_counts_refused_acknowledgements() -> None:
    async def send(reply: Any, traceparent: bytes | None) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_exception(RuntimeError("unknown partition"))
        return future

    sender = ReplySender(send, namespace=NAMESPACE, timeout=0.5, skip_for=60)
    emit = Emit(topic=Topic.OUTCOMES, key="c-1", value=outcome("c-1"))
    await sender.settle(await sender.send((emit,), None))
    assert (sender.sent, sender.failed) == (0, 1)
    assert await sender.send((emit,), None) == []  # skipped for a while


def test_the_client_names_its_reply_topic_on_every_call_and_refuses_a_foreign_one() -> None:
    client = RatifierClient(bootstrap="127.0.0.1:1", replies=True, client_id="agent-7")
    assert client.reply_to == ReplyAddress(topic="ratifier.replies.agent-7")
    sent = json.loads(client._envelope("c-1", "get_payment", {}, "token", "c-1"))
    assert sent["reply_to"] == {"topic": "ratifier.replies.agent-7"}
    assert client.new_call_id() != client.new_call_id()
    shared = RatifierClient(
        bootstrap="127.0.0.1:1", reply_topic="ratifier.replies.fleet", reply_partition=4
    )
    shared_sent = json.loads(shared._envelope("c-2", "get_payment", {}, "token", "c-2"))
    assert shared_sent["reply_to"] == {"topic": "ratifier.replies.fleet", "partition": 4}
    home = RatifierClient(bootstrap="127.0.0.1:1")
    assert home.reply_to is None
    assert "reply_to" not in json.loads(home._envelope("c-3", "get_payment", {}, "t", "c-3"))
    with pytest.raises(ValueError, match="replies"):
        RatifierClient(bootstrap="127.0.0.1:1", reply_topic="ratifier.outcomes")


def test_a_failure_answer_reads_the_reply_address_of_the_record_it_answers() -> None:
    call = {"call_id": "c-5", "reply_to": {"topic": "ratifier.replies.agent-7", "partition": 2}}
    assert reply_to_in(json.dumps(call).encode()) == ReplyAddress(
        topic="ratifier.replies.agent-7", partition=2
    )
    for unreadable in (b"", b"not json", b"[1]", b'{"reply_to": {"topic": "a b"}}', None):
        assert reply_to_in(unreadable) is None
