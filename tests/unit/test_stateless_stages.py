"""The stateless stages' handlers on the runtime loop: one answer per consumed record, in
order; a record the authorizer cannot read fails alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import ConsumerRecord

from commands.catalog import Catalog, Resource
from commands.policy import PolicySet
from commands.validate import Limits
from schemas.envelopes import ValidatedCall
from schemas.names import TRACEPARENT_HEADER, Topic
from streams.authorizer import ResourceAsk, one_by_one
from streams.stateless import authorizer_handler, validator_handler
from tests.unit.conftest import KEYS
from tests.unit.test_stages import PAYMENT, FakeStore, proposed, validated

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Feed:
    def __init__(self, policies: PolicySet) -> None:
        self.current = policies


def record(value: bytes | None, offset: int, headers: Any = ()) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="t.calls",
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"c-1",
        value=value,
        checksum=None,
        serialized_key_size=3,
        serialized_value_size=len(value or b""),
        headers=tuple(headers),
    )


async def test_validator_answers_each_record_with_its_trace(
    catalog: Catalog, policies: PolicySet
) -> None:
    handle = validator_handler(catalog=catalog, limits=Limits(), feed=Feed(policies))  # type: ignore[arg-type]
    parent = f"00-{TRACE}-00f067aa0ba902b7-01".encode()
    good, garbage = await handle(
        [record(proposed(), 7, [(TRACEPARENT_HEADER, parent)]), record(b"\x00", 8)]
    )
    (forwarded,) = good.emits
    assert forwarded.topic is Topic.VALIDATED and isinstance(forwarded.value, ValidatedCall)
    assert forwarded.value.trace_id == TRACE
    assert [e.topic for e in garbage.emits] == [Topic.DEADLETTER]
    assert garbage.emits[0].value.source.offset == 8  # type: ignore[attr-defined]


async def test_authorizer_fails_only_the_unreadable_record(
    catalog: Catalog, policies: PolicySet
) -> None:
    store = FakeStore(PAYMENT)
    batches: list[int] = []

    async def fetch_many(asks: Sequence[ResourceAsk]) -> Sequence[Resource | None]:
        batches.append(len(asks))
        return await one_by_one(store.fetch)(asks)

    handle = authorizer_handler(
        catalog=catalog,
        keys=KEYS,
        feed=Feed(policies),  # type: ignore[arg-type]
        fetch_many=fetch_many,
    )
    call = validated().model_dump_json().encode()
    first, broken, last = await handle([record(call, 1), record(b"{not json", 2), record(call, 3)])
    assert broken.failure == "unreadable" and broken.emits == ()
    for handled in (first, last):
        assert handled.failure is None
        (committed,) = handled.emits  # a read: committed by the authorizer itself (v1.8)
        assert committed.topic is Topic.COMMITTED
    assert batches == [2]  # the readable calls' resources, loaded together


def test_a_stage_s_lane_is_the_partition_and_the_tenant_of_the_key() -> None:
    """Issue 45: inside one partition, each tenant's records are a lane of their own (order
    kept per tenant); records keyed by call id are their partition's lane, as before."""
    from aiokafka import ConsumerRecord

    from streams.stateless import tenant_lane

    def record(partition: int, key: bytes | None) -> ConsumerRecord[bytes, bytes]:
        return ConsumerRecord("calls.proposed", partition, 0, 0, 0, key, b"", None, 1, 0, [])

    assert tenant_lane(record(0, b"tenant-a#0")) == tenant_lane(record(0, b"tenant-a#1"))
    assert tenant_lane(record(0, b"tenant-a#0")) != tenant_lane(record(0, b"tenant-b#0"))
    assert tenant_lane(record(0, b"tenant-a#0")) != tenant_lane(record(1, b"tenant-a#0"))
    assert tenant_lane(record(0, b"c-1")) == tenant_lane(record(0, b"c-2"))
    assert tenant_lane(record(0, None)) == tenant_lane(record(0, b"c-2"))
