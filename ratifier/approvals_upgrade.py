"""`ratifier migrate-approvals`: the approval states the faust join kept (before issue 44)
in its table's changelog topic, `<prefix>ratifier-streams-approvals-changelog`, copied into
the approval-join's table in PostgreSQL, so that no approval pending at the upgrade is lost
(docs/upgrading.md).

The changelog is read from its beginning to its end as of now; per call id the last record
counts (a tombstone: the state was forgotten). Each readable state is kept unless the join
already has one for that call (never overwritten: running it twice, or after the new join
started, changes nothing that is there). It refuses while a member of the join's consumer
group is running: a faust join would still write the changelog, a new one would already
decide without these states. The new join resumes the group's committed offsets, which the
faust join left just after what its changelog holds.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from commands.catalog import load_catalog
from config.settings import Settings
from ratifier.topics import approvals_changelog
from runtime.clients import (
    database_conninfo,
    kafka_admin,
    kafka_consumer,
    pg_pool,
    start_kafka_client,
)
from schemas.errors import ConfigurationError
from schemas.names import APPROVAL_JOIN_GROUP
from streams.approval import ApprovalState
from streams.join_decisions import readable_state
from streams.join_secrets import at_rest, secret_calls
from streams.join_store import JoinStore, Source, Sources

log = logging.getLogger("ratifier.upgrade")

# Group states in which no member runs.
_IDLE_GROUP_STATES = frozenset({"Empty", "Dead", ""})


@dataclass(frozen=True, kw_only=True)
class Migrated:
    """What `ratifier migrate-approvals` found and did."""

    topic: str
    found: bool
    records: int = 0
    states: int = 0
    kept: int = 0
    unreadable: int = 0
    by_phase: dict[str, int] = field(default_factory=dict)

    def render(self) -> str:
        if not self.found:
            return f"migrate-approvals: no topic {self.topic} (nothing to migrate)"
        phases = ", ".join(f"{n} {p}" for p, n in sorted(self.by_phase.items())) or "none"
        return (
            f"migrate-approvals: {self.topic}: {self.records} records, {self.states} states "
            f"({phases}); {self.kept} kept, {self.states - self.kept - self.unreadable} "
            f"already there, {self.unreadable} unreadable"
        )


async def _group_state(settings: Settings) -> str:
    admin = kafka_admin(settings)
    await start_kafka_client(admin, settings.kafka)
    try:
        described: Any = await admin.describe_consumer_groups([settings.group(APPROVAL_JOIN_GROUP)])
    finally:
        await admin.close()
    for response in described:
        for group in getattr(response, "groups", ()):
            return str(group[2])
    return ""


async def read_changelog(
    settings: Settings,
) -> tuple[bool, int, dict[bytes, tuple[bytes | None, Source]]]:
    """Whether the changelog exists, how many records it has, and the last value of each
    key (None: a tombstone) with where it is."""
    topic = approvals_changelog(settings)
    admin = kafka_admin(settings)
    await start_kafka_client(admin, settings.kafka)
    try:
        if topic not in await admin.list_topics():
            return False, 0, {}
        described: Any = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = sorted(p["partition"] for d in described for p in d["partitions"])
    # Subscribed without a group: every partition of the (existing) topic is assigned.
    consumer = kafka_consumer(settings, topic, group=None)
    await start_kafka_client(consumer, settings.kafka)
    latest: dict[bytes, tuple[bytes | None, Source]] = {}
    count = 0
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=1000, max_records=5000)
            for records in batches.values():
                for record in records:
                    count += 1
                    if record.key:
                        where = Source(
                            topic=topic,
                            partition=record.partition,
                            offset=record.offset,
                            kind="state",
                        )
                        latest[record.key] = (record.value, where)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return True, count, latest


async def migrate_approvals(settings: Settings) -> Migrated:
    """Copy the faust join's states into the approval-join's table (the module docstring)."""
    state = await _group_state(settings)
    if state not in _IDLE_GROUP_STATES:
        raise ConfigurationError(
            f"the approval-join's consumer group {settings.group(APPROVAL_JOIN_GROUP)} is "
            f"{state}: stop every approval-join (faust or not) before migrate-approvals"
        )
    topic = approvals_changelog(settings)
    found, records, latest = await read_changelog(settings)
    if not found:
        return Migrated(topic=topic, found=False)
    catalog = load_catalog(settings.catalog)
    states: list[tuple[ApprovalState, Sources]] = []
    unreadable = 0
    for value, where in latest.values():
        if value is None:
            continue  # forgotten
        read = readable_state(value)
        if read is None:
            unreadable += 1
            continue
        # No secret argument at rest: the changelog record keeps them (streams/join_secrets.py).
        sources = {c.call_id: where for c in secret_calls(read, catalog)}
        states.append((at_rest(read, catalog), sources))
    pool = pg_pool(database_conninfo(settings), max_size=1, dict_rows=True)
    await pool.open(wait=True, timeout=30)
    try:
        kept = await JoinStore(pool, deployment=settings.topic_prefix).adopt(states)
    finally:
        await pool.close()
    return Migrated(
        topic=topic,
        found=True,
        records=records,
        states=len(states) + unreadable,
        kept=kept,
        unreadable=unreadable,
        by_phase=dict(Counter(s.phase.value for s, _ in states)),
    )
