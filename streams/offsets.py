"""Two corrections to faust's resumption after a rebalance, so that no record is skipped.

1. **Rewind never-committed partitions.** After every rebalance faust pauses the stream
   partitions, restores tables, then calls `seek_to_committed()` to rewind anything fetched
   meanwhile. aiokafka's implementation only seeks when the committed offset is > 0, so a
   partition this group never committed (or committed at 0) is not rewound: a record fetched
   during recovery and dropped with the buffers is lost — seen as an approval decision
   published during a worker restart that was never processed. For such partitions the
   committed position is the beginning, which is where we seek.

2. **Resume fetching only once the streams take records again.** faust's
   `Recovery._resume_streams` resumes the stream partitions, *then* seeks them to their
   committed offsets, and only after that resumes the flow. A record fetched between the
   seek and the resumed flow is dropped (the flow is suspended) and never fetched again (the
   seek is behind it); if it sits exactly at the committed offset, the records after it are
   acked and faust commits past it (`Consumer._new_offset` accepts one missing offset at the
   committed position). The soak saw exactly that: one call authorized during a rebalance that
   kept its partition on the same worker, never committed, the join's offset past it. Here the
   seek comes first, then the flow, then the partitions: nothing is fetched while nothing is
   taken.

Both can only cause redelivery, which every stage tolerates (idempotent by call id). The
second copies faust-streaming 0.15.3's method, which is why that version is pinned exactly.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from faust.tables.recovery import Recovery

log = logging.getLogger("ratifier.streams")

_original_seek = AIOKafkaConsumer.seek_to_committed
_installed = False


async def _seek_to_committed_or_beginning(self: Any, *partitions: Any) -> Any:
    committed = await _original_seek(self, *partitions)
    never = [tp for tp, offset in committed.items() if not offset]
    if never:
        log.debug("rewinding %d never-committed partitions to their beginning", len(never))
        await self.seek_to_beginning(*never)
    return committed


async def _resume_streams_in_order(self: Any, generation_id: int = 0) -> None:
    """faust 0.15's `Recovery._resume_streams` with its steps reordered (see 2. above)."""
    app = self.app
    consumer = app.consumer
    await app.on_rebalance_complete.send()
    assignment = consumer.assignment()
    if app.consumer_generation_id != generation_id:
        self.log.warning("Recovery rebalancing again")
        return
    streams = {tp for tp in assignment if not self._is_changelog_tp(tp)}
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=app.conf.broker_request_timeout)
    else:
        self.log.info("Resuming streams with empty assignment")
    self.completed.set()
    self.log.info("Resuming flow...")
    app.flow_control.resume()
    consumer.resume_flow()
    if streams:
        consumer.resume_partitions(streams)
    await cast(Any, app)._fetcher.maybe_start()
    self.tables.on_actives_ready()
    self.tables.on_standbys_ready()
    app.on_rebalance_end()
    self.log.info("Worker ready")


def install_rewind_fix() -> None:
    """Install both corrections in this process (idempotent)."""
    global _installed  # noqa: PLW0603 - one process-wide patch
    if not _installed:
        AIOKafkaConsumer.seek_to_committed = _seek_to_committed_or_beginning
        Recovery._resume_streams = _resume_streams_in_order  # type: ignore[method-assign]
        _installed = True
