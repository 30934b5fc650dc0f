"""`ratifier policy replay`: re-decide historical proposals under a candidate policy set,
with no effects, and report which decisions would change.

Reads `calls.proposed` (from the start, from a time, or from an offset), validates each call
with the same pure functions the pipeline uses, verifies its context's signature (expiry is
not checked: history is old), loads the resource read-only with the tenant in the WHERE
(current state), and decides with both the policy set in force and the candidate.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from psycopg_pool import AsyncConnectionPool

from commands.catalog import Catalog
from commands.policy import AuthorizationRequest, Decision, PolicySet, authorize_batch
from commands.validate import Limits, Malformed, Validated, parse_envelope, validate
from config.settings import Settings
from runtime.clients import database_conninfo, kafka_consumer, pg_pool
from runtime.identity import ContextKeys, verify_context_token
from schemas.errors import Unauthenticated
from schemas.names import Topic

EXAMPLES_PER_CHANGE = 3


def label(decision: Decision) -> str:
    if not decision.permitted:
        return "deny"
    return f"permit/{decision.route.value if decision.route else '?'}"


@dataclass
class ReplayReport:
    current_version: str
    candidate_version: str
    read: int = 0
    evaluated: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    changed_calls: set[str] = field(default_factory=set)

    def render(self) -> str:
        lines = [
            f"replayed {self.read} proposals: {self.evaluated} decided under both sets "
            f"({self.current_version} → {self.candidate_version})",
        ]
        if self.skipped:
            lines.append(
                "not decided: " + ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()))
            )
        if not self.changes:
            lines.append("no decision changes")
            return "\n".join(lines)
        lines += ["", f"{'change':40}  {'calls':>6}  examples", "-" * 80]
        for (before, after), count in self.changes.most_common():
            examples = ", ".join(self.examples[(before, after)])
            lines.append(f"{before + ' → ' + after:40}  {count:>6}  {examples}")
        lines.append(f"{'total changed':40}  {sum(self.changes.values()):>6}")
        return "\n".join(lines)


async def _start_positions(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    since: datetime | None,
    from_offset: int | None,
) -> None:
    if since is not None:
        found = await consumer.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in tps})
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            hit = found.get(tp)
            consumer.seek(tp, hit.offset if hit is not None else ends[tp])
    elif from_offset is not None:
        for tp in tps:
            consumer.seek(tp, from_offset)
    else:
        await consumer.seek_to_beginning(*tps)


async def replay(
    settings: Settings,
    *,
    catalog: Catalog,
    keys: ContextKeys,
    current: PolicySet,
    candidate: PolicySet,
    since: datetime | None = None,
    from_offset: int | None = None,
    progress: bool = True,
) -> ReplayReport:
    report = ReplayReport(current_version=current.version, candidate_version=candidate.version)
    limits = Limits(
        max_record_bytes=settings.limits.max_record_bytes,
        max_nesting_depth=settings.limits.max_nesting_depth,
        max_string_length=settings.limits.max_string_length,
        reply_namespace=settings.reply_namespace,
    )
    consumer = kafka_consumer(settings, settings.topic(Topic.PROPOSED), group=None)
    pool = pg_pool(database_conninfo(settings), max_size=2, dict_rows=True, autocommit=True)
    await consumer.start()
    await pool.open(wait=True, timeout=30)
    try:
        tps = sorted(consumer.assignment())
        ends = await consumer.end_offsets(tps)
        await _start_positions(consumer, tps, since, from_offset)
        last_note = time.monotonic()
        while True:
            behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
            if not behind:
                break
            batches = await consumer.getmany(*behind, timeout_ms=500, max_records=1000)
            pending: list[tuple[str, AuthorizationRequest]] = []
            for tp, records in batches.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        continue
                    report.read += 1
                    prepared = await _prepare(
                        record.value,
                        catalog=catalog,
                        keys=keys,
                        limits=limits,
                        pool=pool,
                        report=report,
                    )
                    if prepared is not None:
                        pending.append(prepared)
            _compare(pending, current, candidate, report)
            if progress and time.monotonic() - last_note > 2:
                print(f"replay: {report.read} proposals read…", file=sys.stderr, flush=True)
                last_note = time.monotonic()
    finally:
        await consumer.stop()
        await pool.close()
    return report


async def _prepare(
    raw: bytes | None,
    *,
    catalog: Catalog,
    keys: ContextKeys,
    limits: Limits,
    pool: AsyncConnectionPool[Any],
    report: ReplayReport,
) -> tuple[str, AuthorizationRequest] | None:
    envelope = parse_envelope(raw, limits)
    if isinstance(envelope, Malformed):
        report.skipped["malformed"] += 1
        return None
    result = validate(envelope, catalog, limits)
    if not isinstance(result, Validated):
        report.skipped["rejected at validation"] += 1
        return None
    try:
        actor = verify_context_token(result.call.context, keys, check_expiry=False)
    except Unauthenticated:
        report.skipped["unauthenticated"] += 1
        return None
    resource = None
    if result.tool.load is not None:
        async with pool.connection() as conn:
            resource = await result.tool.load(conn, actor, result.arguments, False)
        if resource is None:
            report.skipped["not_found"] += 1
            return None
    request = AuthorizationRequest(
        actor=actor, tool=result.tool, resource=resource, arguments=result.normalized
    )
    return result.call.call_id, request


def _compare(
    pending: list[tuple[str, AuthorizationRequest]],
    current: PolicySet,
    candidate: PolicySet,
    report: ReplayReport,
) -> None:
    if not pending:
        return
    requests = [r for _, r in pending]
    before = authorize_batch(requests, current)
    after = authorize_batch(requests, candidate)
    for (call_id, _), old, new in zip(pending, before, after, strict=True):
        report.evaluated += 1
        change = (label(old), label(new))
        if change[0] != change[1]:
            report.changes[change] += 1
            report.changed_calls.add(call_id)
            if len(report.examples[change]) < EXAMPLES_PER_CHANGE:
                report.examples[change].append(call_id)
