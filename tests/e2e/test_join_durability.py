"""The approval-join on PostgreSQL survives what kills a worker (issue 44): kill -9 at each
step of its transaction and of its outbox publisher, two workers sharing the partitions and
handing them over under approval load, an expiry due while no join runs. Real Kafka,
PostgreSQL, stages, executor and provider; every approval ends once and every approved refund
runs once at the provider."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from approvals.signing import approval_keys, sign_decision, statement_for
from ratifier.topics import delete_topics
from runtime.clients import kafka_consumer, kafka_producer
from schemas.envelopes import Actor, ApprovalVerdict
from schemas.names import APPROVAL_JOIN_GROUP, Topic
from tests.e2e.approvals_kit import audit, decide, propose, propose_only, token
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.e2e.executor_kit import provider_stats
from tests.services import commit_lag, outcomes_by_call, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FINAL = {"succeeded", "rejected", "denied", "failed", "conflict", "expired", "cancelled"}


@contextlib.contextmanager
def join_apart(keys: SigningKeys, name: str, *, approval_ttl: int = 25) -> Iterator[Pipeline]:
    """Stages, one executor and a provider on their own topics; the approval-join is the
    test's to start (``pipeline.start("approval-join", ...)``)."""
    pipeline = start_pipeline(
        keys, f"{name}-{uuid.uuid4().hex[:4]}", streams=False, approval_ttl=approval_ttl
    )
    try:
        pipeline.start("stages", "stages", RATIFIER_STREAMS__HTTP_PORT=str(pipeline.http_port))
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def start_join(pipeline: Pipeline, name: str) -> None:
    pipeline.start("approval-join", name, RATIFIER_STREAMS__HTTP_PORT="0")


def crash_join(pipeline: Pipeline, name: str, point: str) -> None:
    """An approval-join that SIGKILLs itself at ``point``; returns once it did."""
    crashing = pipeline.start_crashing(
        "approval-join", name, at=f"{point}:1", RATIFIER_STREAMS__HTTP_PORT="0"
    )
    deadline = time.monotonic() + 90
    while crashing.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert crashing.process.poll() == -9, f"no crash at {point}:\n{crashing.log_tail()}"
    pipeline.workers.remove(crashing)
    crashing.stop()


def caught_up(pipeline: Pipeline, timeout: float = 60) -> None:
    """The join's group committed both its inputs to their ends, and the deployment's outbox
    is empty (the records a killed worker left are published)."""
    inputs = [
        (APPROVAL_JOIN_GROUP, Topic.AUTHORIZED),
        (APPROVAL_JOIN_GROUP, Topic.APPROVALS_DECIDED),
    ]
    assert run(commit_lag(pipeline.settings, inputs, timeout=timeout)) == {}
    deadline = time.monotonic() + timeout
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        while True:
            (left,) = conn.execute(
                "SELECT count(*) FROM approval_outbox WHERE deployment = %s",
                (pipeline.settings.topic_prefix,),
            ).fetchone() or (0,)
            if left == 0:
                return
            assert time.monotonic() < deadline, f"{left} records left in the outbox"
            time.sleep(0.2)


def by_call(records: list[Any], topic: Topic) -> dict[str, list[bytes]]:
    found: dict[str, list[bytes]] = {}
    for record in records:
        if record.topic.endswith(topic.value):
            found.setdefault(json.loads(record.value)["call_id"], []).append(record.value)
    return found


def ended(pipeline: Pipeline, ids: set[str], timeout: float = 120) -> dict[str, list[str]]:
    """Each call's final statuses, once each has one."""

    def done(records: list[Any]) -> bool:
        found = outcomes_by_call(records)
        return all(any(o["status"] in FINAL for o in found.get(c, [])) for c in ids)

    found = outcomes_by_call(
        run(read_until(pipeline.settings, [Topic.OUTCOMES], done, timeout=timeout))
    )
    return {c: [o["status"] for o in found[c] if o["status"] in FINAL] for c in ids}


# Where a killed worker may leave records it had published but not cleared: they go out again
# (identical copies); everywhere else each record goes out exactly once.
REPUBLISHED = {"join_published", "join_orphans_published"}


@pytest.mark.parametrize(
    "point",
    [
        "join_decided",
        "join_written",
        "join_committed",
        "join_taken",
        "join_published",
        "join_cleared",
        "join_orphans_taken",
        "join_orphans_published",
    ],
)
def test_kill_minus_nine_at_each_step_of_the_join(killing: Pipeline, point: str) -> None:
    pipeline = killing
    try:
        kill_at(pipeline, point)
    finally:
        # This point's join workers go: the next point's must get every partition.
        for worker in [w for w in pipeline.workers if w.name.startswith(point)]:
            pipeline.stop_worker(worker.name)


@pytest.fixture(scope="module")
def killing(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    """Stages, an executor and a provider shared by the kill points (each has its own calls
    and join workers, and stops them when it ends)."""
    with join_apart(signing_keys, "join-kill") as pipeline:
        yield pipeline


def kill_at(pipeline: Pipeline, point: str) -> None:
    start_join(pipeline, f"{point}-join")
    requests = propose(pipeline, n=4, amount_minor=1)
    ids = {r["call_id"] for r in requests}
    pipeline.stop_worker(f"{point}-join")
    boss = token(pipeline.settings, "boss")
    for request in requests:
        decide(pipeline, request, boss)
    if point.startswith("join_orphans"):
        # A worker dies with the decisions committed and their records unpublished; the
        # next one dies at ``point`` while publishing what the first left.
        crash_join(pipeline, f"{point}-dead", "join_committed")
    crash_join(pipeline, f"{point}-crashing", point)
    start_join(pipeline, f"{point}-after")

    statuses = ended(pipeline, ids)
    # The new worker has applied (or skipped) everything redelivered to it, and published
    # what the dead ones left: only then is "once" what it will stay.
    caught_up(pipeline)
    assert statuses == {c: statuses[c][:1] * len(statuses[c]) for c in ids}
    assert {c: statuses[c][0] for c in ids} == dict.fromkeys(ids, "succeeded")
    stats = provider_stats(pipeline.provider_url)
    # This point's refunds (the provider is shared by the points), each applied once.
    effects = {k: n for k, n in stats["by_key"].items() if k.split(":", 1)[-1] in ids}
    assert len(effects) == len(ids)
    assert set(effects.values()) == {1}
    records = run(read_to_end(pipeline.settings, [Topic.COMMITTED, Topic.APPROVALS_REQUESTED]))
    commands = by_call(records, Topic.COMMITTED)
    asked = by_call(records, Topic.APPROVALS_REQUESTED)
    assert ids <= set(commands)
    for call_id in ids:
        # Copies of one command are the same record (the executor ran it once).
        assert len(set(commands[call_id])) == 1, commands[call_id]
        assert len(asked[call_id]) == 1
        if point not in REPUBLISHED:
            assert len(commands[call_id]) == 1, (point, len(commands[call_id]))
        kinds = Counter(kind for kind, _detail in audit(pipeline, call_id))
        # The decision counted once: no replay refused, no second decision row.
        assert kinds["approval_decision"] == 1, kinds
        assert kinds["approval_decision_refused"] == 0, kinds
    assert pipeline.alive()


class Approver(threading.Thread):
    """Approves every request of the test's calls as it appears (a bot approver)."""

    def __init__(self, pipeline: Pipeline, prefix: str) -> None:
        super().__init__(daemon=True)
        self.pipeline = pipeline
        self.prefix = prefix
        self.halt = threading.Event()
        self.approved: set[str] = set()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            run(self._approve())
        except BaseException as exc:
            self.failure = exc

    async def _approve(self) -> None:
        settings = self.pipeline.settings
        keys = approval_keys(settings)
        boss = Actor(sub="boss", tenant="tenant-a", roles=("approver",))
        consumer = kafka_consumer(settings, settings.topic(Topic.APPROVALS_REQUESTED), group=None)
        producer = kafka_producer(settings)
        await consumer.start()
        await producer.start()
        try:
            while not self.halt.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    for record in records:
                        request = json.loads(record.value)
                        call_id = request["call_id"]
                        if not call_id.startswith(self.prefix) or call_id in self.approved:
                            continue
                        signed = sign_decision(
                            statement_for(
                                call_id=call_id,
                                tenant=request["tenant"],
                                fingerprint=request["fingerprint"],
                                approver=boss,
                                verdict=ApprovalVerdict.APPROVE,
                                now=datetime.now(UTC),
                                validity=keys.decision_validity,
                            ),
                            keys,
                        )
                        await producer.send_and_wait(
                            settings.topic(Topic.APPROVALS_DECIDED),
                            key=call_id.encode(),
                            value=signed.to_bytes(),
                        )
                        self.approved.add(call_id)
        finally:
            await consumer.stop()
            await producer.stop()


def test_two_join_workers_hand_over_under_approval_load(signing_keys: SigningKeys) -> None:
    with join_apart(signing_keys, "join-rebalance") as pipeline:
        start_join(pipeline, "join-a")
        bot = Approver(pipeline, "ap-")
        bot.start()
        try:
            ids: set[str] = set()
            for wave in range(3):
                calls = set(propose_only(pipeline, 20, amount_minor=1))
                ids |= calls
                # Half of the wave's requests seen (and approved): the rest are in flight as
                # the partitions move.
                deadline = time.monotonic() + 60
                while len(calls & bot.approved) < len(calls) // 2:
                    assert time.monotonic() < deadline, "requests stopped coming"
                    time.sleep(0.05)
                if wave == 0:
                    start_join(pipeline, "join-b")  # a second worker takes half the partitions
                if wave == 1:
                    pipeline.stop_worker("join-a")  # and the survivor takes them all
            statuses = ended(pipeline, ids, timeout=150)
            caught_up(pipeline)
        finally:
            bot.halt.set()
            bot.join(timeout=10)
        assert bot.failure is None, bot.failure
        assert statuses == {c: ["succeeded"] for c in ids}, {
            c: s for c, s in statuses.items() if s != ["succeeded"]
        }
        records = run(read_to_end(pipeline.settings, [Topic.COMMITTED, Topic.APPROVALS_REQUESTED]))
        assert {c: len(v) for c, v in by_call(records, Topic.COMMITTED).items()} == (
            dict.fromkeys(ids, 1)
        )
        assert {c: len(v) for c, v in by_call(records, Topic.APPROVALS_REQUESTED).items()} == (
            dict.fromkeys(ids, 1)
        )
        stats = provider_stats(pipeline.provider_url)
        assert len(stats["by_key"]) == len(ids)
        assert set(stats["by_key"].values()) == {1}
        assert pipeline.alive()


def test_an_expiry_due_while_no_join_runs_fires_once_after_the_restart(
    signing_keys: SigningKeys,
) -> None:
    with join_apart(signing_keys, "join-expiry", approval_ttl=12) as pipeline:
        start_join(pipeline, "join")
        requests = propose(pipeline, n=3, amount_minor=1)
        ids = {r["call_id"] for r in requests}
        pipeline.stop_worker("join")
        latest = max(datetime.fromisoformat(r["expires_at"]) for r in requests)
        while datetime.now(UTC) <= latest:  # every request expires while no join runs
            time.sleep(0.2)
        start_join(pipeline, "join-restarted")
        statuses = ended(pipeline, ids, timeout=60)
        assert statuses == {c: ["expired"] for c in ids}
        # A decision after the expiry commits nothing.
        decide(pipeline, requests[0], token(pipeline.settings, "boss"))
        records = run(read_to_end(pipeline.settings, [Topic.COMMITTED]))
        assert not set(by_call(records, Topic.COMMITTED)) & ids
        assert pipeline.alive()
