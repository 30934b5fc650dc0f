"""Records handed to a producer in one batch per topic-partition, each batch with the members
(items of the caller) whose records it holds: one await and one acknowledgement per batch, not
per record. Used by the consumer loop's batched sends (runtime/loop.py) and by the records a
handler publishes itself (runtime/bulk.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from aiokafka import AIOKafkaProducer

log = logging.getLogger("ratifier.runtime")

Headers = list[tuple[str, bytes]]


class ProducerBatches:
    """Batches being built for ``producer``, then handed to it by :meth:`send`."""

    def __init__(self, producer: AIOKafkaProducer, *, what: str) -> None:
        self._producer = producer
        self._what = what
        self._building: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        self._built: list[tuple[str, int, Any, list[int]]] = []

    def add(
        self,
        member: int,
        *,
        topic: str,
        partition: int,
        key: bytes,
        value: bytes,
        headers: Headers,
    ) -> None:
        """One record of ``member`` into its topic-partition's batch (in the order added)."""
        slot = (topic, partition)
        found = self._building.get(slot)
        if found is None:
            found = self._building[slot] = (self._producer.create_batch(), [])
        batch, members = found
        if not batch.append(timestamp=None, key=key, value=value, headers=headers):
            self._built.append((topic, partition, batch, members))  # full: a new one,
            batch, members = self._building[slot] = (self._producer.create_batch(), [])
            # which takes its first record whatever its size (aiokafka's builder)
            batch.append(timestamp=None, key=key, value=value, headers=headers)
        members.append(member)

    async def send(self) -> list[tuple[Awaitable[Any] | None, list[int]]]:
        """Hand every batch to the producer: per batch, its acknowledgement (None: the producer
        did not take it) and the members whose records it holds (a member once per record)."""
        built = self._built + [(t, p, *b) for (t, p), b in self._building.items()]
        self._built, self._building = [], {}
        sent: list[tuple[Awaitable[Any] | None, list[int]]] = []
        for topic, partition, batch, members in built:
            if not members:
                continue
            batch.close()
            try:
                ack: Awaitable[Any] | None = await self._producer.send_batch(
                    batch, topic, partition=partition
                )
            except Exception as exc:  # noqa: BLE001 - its records then go another way
                log.warning(
                    "%s: a batch for %s[%d] not taken (%r)", self._what, topic, partition, exc
                )
                ack = None
            sent.append((ack, members))
        return sent
