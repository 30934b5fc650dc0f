"""A stream stage's publications with fake faust topics: a record whose output is refused
(by the producer or the broker) is answered by a dead letter and a typed outcome; the other
records of the batch are published as decided."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError

from runtime.emit import Emit
from schemas.envelopes import Outcome, Stage, Status
from schemas.names import Topic
from streams.publisher import StagePublisher

LIMIT = 10_000


@dataclass
class Message:
    topic: str
    partition: int
    offset: int


@dataclass
class Event:
    key: bytes | None
    value: bytes
    message: Message


class FakeTopic:
    def __init__(self, name: Topic, sent: list[tuple[Topic, dict[str, Any]]]) -> None:
        self.name = name
        self.sent = sent

    async def send(self, *, key: bytes | None, value: bytes, headers: Any) -> Any:
        if len(value) > LIMIT:
            raise MessageSizeTooLargeError("too large")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if b"refused-by-broker" in value and b'"status":"rejected"' in value:
            future.set_exception(MessageSizeTooLargeError("broker refused"))
        else:
            self.sent.append((self.name, json.loads(value)))
            future.set_result(None)
        return future


def rejected(call_id: str, tool: str = "get_payment") -> Emit:
    value = Outcome(
        call_id=call_id,
        tool=tool,
        tenant=None,
        status=Status.REJECTED,
        stage=Stage.VALIDATE,
        at=datetime.now(UTC),
    )
    return Emit(topic=Topic.OUTCOMES, key=call_id, value=value)


async def test_refused_outputs_cost_only_their_record() -> None:
    sent: list[tuple[Topic, dict[str, Any]]] = []
    publisher = StagePublisher({t: FakeTopic(t, sent) for t in Topic})

    def event(offset: int, call_id: str) -> Event:
        raw = json.dumps({"call_id": call_id, "pad": "x" * 100}).encode()
        return Event(call_id.encode(), raw, Message("p.calls.proposed", 0, offset))

    await publisher.publish_all(
        Stage.VALIDATE,
        [
            (event(0, "c-0"), (rejected("c-0"),), None),
            # Too large for the producer (a tool name cannot be, but any output may be).
            (event(1, "c-big"), (rejected("c-big", "t" * LIMIT),), None),
            (event(2, "refused-by-broker"), (rejected("refused-by-broker"),), None),
            (event(3, "c-3"), (rejected("c-3"),), None),
        ],
    )

    outcomes = {body["call_id"]: body for topic, body in sent if topic is Topic.OUTCOMES}
    assert outcomes["c-0"]["status"] == outcomes["c-3"]["status"] == "rejected"
    # A refused outcome is tried again without its result, then replaced by a generic one.
    letters = [body for topic, body in sent if topic is Topic.DEADLETTER]
    assert sorted(d["source"]["offset"] for d in letters) == [1, 2]
    assert {d["call_id"] for d in letters} == {"c-big", "refused-by-broker"}
    assert outcomes["refused-by-broker"]["status"] == "failed"
    assert outcomes["refused-by-broker"]["error"]["code"] == "permanent_error"
    assert outcomes["c-big"]["status"] == "failed"
