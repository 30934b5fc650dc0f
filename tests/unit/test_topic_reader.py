"""A topic reader whose consumer cannot start closes that consumer (its client's sockets and
tasks) before the error goes on, so the retry that follows does not leak one per attempt."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

import runtime.reader
from config.settings import Settings
from runtime.reader import TopicReader
from schemas.names import Topic


class UnreachableConsumer:
    def __init__(self) -> None:
        self.stopped = 0

    async def start(self) -> None:
        raise KafkaConnectionError("no broker")

    async def stop(self) -> None:
        self.stopped += 1


async def test_a_consumer_whose_start_failed_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[UnreachableConsumer] = []

    def consumer(*_args: Any, **_kwargs: Any) -> UnreachableConsumer:
        made.append(UnreachableConsumer())
        return made[-1]

    monkeypatch.setattr(runtime.reader, "kafka_consumer", consumer)
    reader = TopicReader(Settings(topic_prefix="u."), [Topic.POLICIES], lambda _t, _v: None)
    for _ in range(2):
        with pytest.raises(KafkaConnectionError):
            await reader.catch_up()
    assert [c.stopped for c in made] == [1, 1]
    await reader.close()  # nothing left open to close
    assert [c.stopped for c in made] == [1, 1]
