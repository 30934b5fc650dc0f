"""Every call answered `unknown` settles, once the dependency is back (issue 17, point 2):
a retry sharing an unknown operation, a reconciler killed between committing a settlement
and publishing it, and PostgreSQL restarting under the reconciler (on a private cluster)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from config.settings import Settings
from ratifier.migrate import migrate
from ratifier.processes import WorkerProcess, wait_for_log
from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.conftest import Pipeline, SigningKeys, free_port, start_pipeline
from tests.e2e.executor_kit import provider_stats, publish_commands, refund_command, seed_payments
from tests.e2e.history import SETTLED
from tests.e2e.private_services import (
    Forwarder,
    kafka_jars,
    private_kafka,
    private_postgres,
    required,
    server_binaries,
)
from tests.e2e.test_reconciliation import faults, park_leftovers
from tests.services import TEST_DATABASE_URL, outcomes_by_call, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# A patient reconciler: checks every 0.2 to 1 s, never escalates within a test.
PATIENT = {
    "RATIFIER_RECONCILER__BACKOFF_SECONDS": "0.2",
    "RATIFIER_RECONCILER__BACKOFF_CAP_SECONDS": "1",
    "RATIFIER_RECONCILER__ATTEMPTS": "500",
}


def start_executor_only(
    keys: SigningKeys, name: str, database_url: str = "", kafka_bootstrap: str = ""
) -> Pipeline:
    """A provider and an executor (on ``database_url`` and ``kafka_bootstrap`` when given);
    no streams worker."""
    return start_pipeline(
        keys,
        f"{name}-{uuid.uuid4().hex[:4]}",
        streams=False,
        RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS="3",
        RATIFIER_EXECUTOR__RETRY_ATTEMPTS="2",
        RATIFIER_STORAGE__DATABASE_URL=database_url or TEST_DATABASE_URL,
        RATIFIER_KAFKA_BOOTSTRAP=kafka_bootstrap or Settings().kafka_bootstrap,
    )


@pytest.fixture
def executor_only(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    """Provider and executor on the test database; each test starts its own reconcilers."""
    pipeline = start_executor_only(signing_keys, "settle")
    seed_payments(pipeline.settings)
    park_leftovers(pipeline)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def outcomes_until_all(
    settings: Settings, call_ids: list[str], statuses: set[str], timeout: float = 120
) -> dict[str, list[dict[str, Any]]]:
    """Every call's outcomes once each has one with a status in ``statuses``."""

    def done(records: list[Any]) -> bool:
        found = outcomes_by_call(records)
        return all(any(o["status"] in statuses for o in found.get(c, [])) for c in call_ids)

    records = run(read_until(settings, [Topic.OUTCOMES], done, timeout=timeout))
    found = outcomes_by_call(records)
    return {c: found.get(c, []) for c in call_ids}


def final_outcomes(seen: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """A call's distinct settled outcomes (a repeat of the identical outcome counts once)."""
    return {
        (o["status"], o["stage"], (o.get("result") or {}).get("provider_ref"))
        for o in seen
        if o["status"] in SETTLED
    }


def assert_each_settled_once(by_call: dict[str, list[dict[str, Any]]]) -> str:
    """Every call ended with exactly one final outcome, `succeeded`, and the same one (the
    one provider reference); returns that reference."""
    refs = set()
    for call_id, seen in by_call.items():
        finals = final_outcomes(seen)
        assert len(finals) == 1, (call_id, seen)
        ((status, _stage, ref),) = finals
        assert status == "succeeded", (call_id, seen)
        assert seen[-1]["status"] == "succeeded", (call_id, seen)  # nothing after it
        assert seen[-1]["call_id"] == call_id
        refs.add(ref)
    assert len(refs) == 1 and next(iter(refs)).startswith("prv_"), refs
    return str(next(iter(refs)))


def query(database_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, args).fetchall()


def outbox(database_url: str, operation_id: str) -> list[tuple[str, bool]]:
    """(call id, published?) of each outcome the operation's settlement owes."""
    return [
        (str(r[0]), bool(r[1]))
        for r in query(
            database_url,
            "SELECT call_id, published_at IS NOT NULL FROM settlement_outbox "
            "WHERE operation_id = %s ORDER BY id",
            operation_id,
        )
    ]


def wait_marked_published(database_url: str, operation_id: str, calls: list[str]) -> None:
    """The operation's outbox holds one outcome per call, each marked published (the
    reconciler marks them on its next cycle, after the broker's acknowledgement)."""
    deadline = time.monotonic() + 30
    while sorted(outbox(database_url, operation_id)) != sorted((c, True) for c in calls):
        assert time.monotonic() < deadline, outbox(database_url, operation_id)
        time.sleep(0.2)


def ledger_row(database_url: str, operation_id: str) -> tuple[str, int]:
    rows = query(
        database_url,
        "SELECT status, reconcile_attempts FROM command_ledger WHERE operation_id = %s",
        operation_id,
    )
    assert rows, operation_id
    return str(rows[0][0]), int(rows[0][1])


def make_two_calls_unknown(pipeline: Pipeline, key: str) -> tuple[str, str, str]:
    """Refund A, its response lost (applied, unanswered); then B, the same key and
    arguments, while A's operation is unresolved: both answered `unknown`."""
    faults(pipeline, drop_after=1)
    first = refund_command(key)
    retry = refund_command(key, call_id=f"retry-{uuid.uuid4().hex[:12]}")
    publish_commands(pipeline.settings, [first, retry])
    outcomes_until_all(pipeline.settings, [first.call_id, retry.call_id], {"unknown"}, 60)
    return first.operation_id, first.call_id, retry.call_id


def wait_exit(worker: WorkerProcess, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, f"{worker.name} still running:\n{worker.log_tail()}"
        time.sleep(0.1)
    return worker.process.returncode


def test_retry_sharing_an_unknown_operation_gets_the_settlement(
    executor_only: Pipeline,
) -> None:
    """The chaos-run repro: provider latency 8 s (beyond the client's 5 s); refund A and
    refund B with the same key and arguments both end `unknown`; the fault clears: both end
    `succeeded`, and a call arriving after the settlement gets it too."""
    pipeline = executor_only
    pipeline.start("reconciler", "reconciler", **PATIENT)
    faults(pipeline, latency_ms=8000)
    key = f"shared-{uuid.uuid4().hex[:10]}"
    first = refund_command(key)
    retry = refund_command(key, call_id=f"retry-{uuid.uuid4().hex[:12]}")
    publish_commands(pipeline.settings, [first, retry])
    calls = [first.call_id, retry.call_id]
    unknown = outcomes_until_all(pipeline.settings, calls, {"unknown"}, 90)
    assert all(seen[0]["status"] == "unknown" for seen in unknown.values())
    faults(pipeline)  # the provider is fast again
    settled = outcomes_until_all(pipeline.settings, calls, SETTLED, 90)
    ref = assert_each_settled_once(settled)
    for call_id, seen in settled.items():
        assert [o["status"] for o in seen] == ["unknown", "succeeded"], (call_id, seen)
        assert seen[-1]["stage"] == "reconcile"
        # Readdressed to its own call, in its own trace.
        assert seen[-1]["trace_id"] == seen[0]["trace_id"]
    assert settled[first.call_id][-1]["trace_id"] != settled[retry.call_id][-1]["trace_id"]

    late = refund_command(key, call_id=f"late-{uuid.uuid4().hex[:12]}")
    publish_commands(pipeline.settings, [late])
    after = outcomes_until_all(pipeline.settings, [late.call_id], SETTLED, 60)[late.call_id]
    assert [(o["status"], o["result"]["provider_ref"]) for o in after] == [("succeeded", ref)]

    db = pipeline.settings.storage.database_url
    assert provider_stats(pipeline.provider_url)["by_key"][first.operation_id] == 1
    assert ledger_row(db, first.operation_id)[0] == "succeeded"
    wait_marked_published(db, first.operation_id, calls)
    assert not query(db, "SELECT 1 FROM unknown_calls WHERE idempotency_key = %s", key)
    assert pipeline.worker("reconciler").process.poll() is None


def test_reconciler_killed_between_settlement_and_publish_loses_nothing(
    executor_only: Pipeline,
) -> None:
    pipeline = executor_only
    db = pipeline.settings.storage.database_url
    key = f"crash-{uuid.uuid4().hex[:10]}"
    operation_id, first, retry = make_two_calls_unknown(pipeline, key)

    crashing = pipeline.start_crashing(
        "reconciler", "reconciler-crashing", at="after_settle:1", **PATIENT
    )
    assert wait_exit(crashing, 90) == -9, crashing.log_tail()
    assert "crash test: SIGKILL at after_settle" in crashing.log_tail()
    # Settled and committed, nothing published: both outcomes owed, in the outbox.
    assert ledger_row(db, operation_id)[0] == "succeeded"
    assert sorted(outbox(db, operation_id)) == sorted([(first, False), (retry, False)])
    published = outcomes_by_call(run(read_to_end(pipeline.settings, [Topic.OUTCOMES])))
    assert not final_outcomes(published.get(first, [])) | final_outcomes(published[retry])

    pipeline.start("reconciler", "reconciler-restarted", **PATIENT)
    settled = outcomes_until_all(pipeline.settings, [first, retry], SETTLED, 90)
    assert_each_settled_once(settled)
    wait_marked_published(db, operation_id, [first, retry])
    assert provider_stats(pipeline.provider_url)["by_key"][operation_id] == 1


def cycle_failures(worker: WorkerProcess) -> int:
    return worker.log_path.read_text(errors="replace").count("reconciler cycle failed")


def start_retries(worker: WorkerProcess) -> int:
    """Start-up hooks the service shell retried (runtime/shell.py: alive, not ready)."""
    return worker.log_path.read_text(errors="replace").count("reconciler waits for")


def publish_failures(worker: WorkerProcess) -> int:
    """Publications the reconciler's loop found the broker away for (and waits out)."""
    return worker.log_path.read_text(errors="replace").count("reconcile: broker unavailable")


def test_reconciler_survives_postgres_restart_and_settles(signing_keys: SigningKeys) -> None:
    """On a private cluster (the shared server is never touched): the reconciler works on two
    unknown calls while the provider is down; PostgreSQL stops hard under it, the provider
    comes back meanwhile, PostgreSQL starts again: the same process settles both calls."""
    required(server_binaries(), "PostgreSQL server binaries")
    with private_postgres() as server:
        migrate(server.url)
        pipeline = start_executor_only(signing_keys, "pgrestart", server.url)
        settings = pipeline.settings.changed(storage={"database_url": server.url})
        pipeline.settings = settings
        try:
            seed_payments(settings)
            key = f"pg-{uuid.uuid4().hex[:10]}"
            operation_id, first, retry = make_two_calls_unknown(pipeline, key)
            faults(pipeline, down=True)  # reconciliation cannot tell yet
            reconciler = pipeline.start("reconciler", "reconciler", **PATIENT)
            deadline = time.monotonic() + 60
            while ledger_row(server.url, operation_id)[1] < 2:
                assert time.monotonic() < deadline, reconciler.log_tail()
                time.sleep(0.2)

            server.crash()
            faults(pipeline)  # the provider is back while the database is not
            deadline = time.monotonic() + 60
            while cycle_failures(reconciler) < 4:  # ~0.5+1+2 s of retries at least
                assert reconciler.process.poll() is None, reconciler.log_tail()
                assert time.monotonic() < deadline, reconciler.log_tail()
                time.sleep(0.2)
            assert reconciler.process.poll() is None, reconciler.log_tail()
            server.start()

            settled = outcomes_until_all(settings, [first, retry], SETTLED, 120)
            assert_each_settled_once(settled)
            assert reconciler.process.poll() is None, reconciler.log_tail()
            assert wait_for_log(reconciler, "reconciler recovered", timeout=10)
            assert ledger_row(server.url, operation_id)[0] == "succeeded"
            assert provider_stats(pipeline.provider_url)["by_key"][operation_id] == 1
        finally:
            pipeline.stop()
            run(delete_topics(pipeline.settings))


def test_reconciler_survives_an_unreachable_broker_and_settles(executor_only: Pipeline) -> None:
    """The broker is unreachable when the reconciler starts (its address refuses
    connections): the process keeps retrying, and settles both waiting calls once the
    address answers. (The shared broker is never stopped: a forwarder stands for it.)"""
    pipeline = executor_only
    operation_id, first, retry = make_two_calls_unknown(pipeline, f"kafka-{uuid.uuid4().hex[:10]}")
    host, _, port = pipeline.settings.kafka_bootstrap.partition(":")
    broker = Forwarder(free_port(), (host, int(port)))
    try:
        reconciler = pipeline.start(
            "reconciler",
            "reconciler",
            RATIFIER_KAFKA_BOOTSTRAP=f"127.0.0.1:{broker.port}",
            **PATIENT,
        )
        deadline = time.monotonic() + 60
        while start_retries(reconciler) < 3:
            assert reconciler.process.poll() is None, reconciler.log_tail()
            assert time.monotonic() < deadline, reconciler.log_tail()
            time.sleep(0.2)
        assert ledger_row(pipeline.settings.storage.database_url, operation_id)[0] == "unknown"
        broker.start()
        settled = outcomes_until_all(pipeline.settings, [first, retry], SETTLED, 120)
        assert_each_settled_once(settled)
        assert reconciler.process.poll() is None, reconciler.log_tail()
        assert wait_for_log(reconciler, "reconciler started", timeout=10)
    finally:
        broker.close()


def test_reconciler_survives_a_broker_crash_and_publishes_what_it_settled(
    signing_keys: SigningKeys,
) -> None:
    required(kafka_jars(), "the Kafka jars and java for a private broker")
    """On a private broker (the shared one is never touched): the reconciler works on two
    unknown calls; the broker is killed; the provider comes back, so the reconciler settles
    in the database but cannot publish; the broker restarts: the same process publishes both
    owed outcomes from the outbox."""
    with private_kafka() as kafka:
        pipeline = start_executor_only(signing_keys, "kafkacrash", kafka_bootstrap=kafka.bootstrap)
        shared = pipeline.settings
        pipeline.settings = shared.with_kafka(bootstrap=kafka.bootstrap)
        db = shared.storage.database_url
        try:
            seed_payments(pipeline.settings)
            park_leftovers(pipeline)
            operation_id, first, retry = make_two_calls_unknown(
                pipeline, f"kc-{uuid.uuid4().hex[:10]}"
            )
            faults(pipeline, down=True)
            reconciler = pipeline.start(
                "reconciler", "reconciler", RATIFIER_KAFKA_BOOTSTRAP=kafka.bootstrap, **PATIENT
            )
            deadline = time.monotonic() + 60
            while ledger_row(db, operation_id)[1] < 2:
                assert time.monotonic() < deadline, reconciler.log_tail()
                time.sleep(0.2)

            kafka.kill()
            faults(pipeline)  # the provider is back while the broker is not
            # The producer gives a publication up after its request timeout (40 s) and the
            # loop sends it again: once is enough to know it was tried while the broker was away.
            deadline = time.monotonic() + 120
            while not (
                ledger_row(db, operation_id)[0] == "succeeded" and publish_failures(reconciler) >= 1
            ):
                assert reconciler.process.poll() is None, reconciler.log_tail()
                assert time.monotonic() < deadline, reconciler.log_tail()
                time.sleep(0.2)
            # Settled, and owed: the outbox keeps both outcomes until the broker acknowledges.
            assert sorted(outbox(db, operation_id)) == sorted([(first, False), (retry, False)])
            kafka.start()

            settled = outcomes_until_all(pipeline.settings, [first, retry], SETTLED, 120)
            assert_each_settled_once(settled)
            wait_marked_published(db, operation_id, [first, retry])
            assert reconciler.process.poll() is None, reconciler.log_tail()
            assert provider_stats(pipeline.provider_url)["by_key"][operation_id] == 1
        finally:
            pipeline.stop()
            run(delete_topics(shared))  # start_pipeline created them on the shared broker too
