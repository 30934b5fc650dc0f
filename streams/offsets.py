"""A correction to faust's rewind after recovery, so that no record is skipped.

After every rebalance faust pauses the stream partitions, restores tables, then calls
`seek_to_committed()` to rewind anything fetched meanwhile. aiokafka's implementation only
seeks when the committed offset is > 0, so a partition this group never committed (or
committed at 0) is not rewound: a record fetched during recovery and dropped with the buffers
is lost — seen as an approval decision published during a worker restart that was never
processed. For such partitions the committed position is the beginning, which is where we
seek. Rewinding can only cause redelivery, which every stage tolerates (idempotent by call id).
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer

log = logging.getLogger("ratifier.streams")

_original = AIOKafkaConsumer.seek_to_committed
_installed = False


async def _seek_to_committed_or_beginning(self: Any, *partitions: Any) -> Any:
    committed = await _original(self, *partitions)
    never = [tp for tp, offset in committed.items() if not offset]
    if never:
        log.debug("rewinding %d never-committed partitions to their beginning", len(never))
        await self.seek_to_beginning(*never)
    return committed


def install_rewind_fix() -> None:
    """Patch `AIOKafkaConsumer.seek_to_committed` in this process (idempotent)."""
    global _installed  # noqa: PLW0603 - one process-wide patch
    if not _installed:
        AIOKafkaConsumer.seek_to_committed = _seek_to_committed_or_beginning
        _installed = True
