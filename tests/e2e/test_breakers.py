"""Circuit breakers on the real pipeline (Kafka, Redis, PostgreSQL, two executor processes):
a payment provider outage under load (refunds and reads, 50 calls/s for about 20 s). The
provider's write breaker, shared by both executors, opens within 5 s of the outage; while it
is open the provider sees no attempt (its counters, sampled every 0.1 s); every call gets
one final outcome (`unavailable` with `retry_after` for those refused; reads, judged by
their own breaker, all succeed); it closes within 10 s of the recovery; each change of state
is a `breakers` record and an audit row.

And the breaker is one for the fleet: opened by one executor's failures, a second executor
process refuses the downstream's calls `unavailable` without a single attempt (the
provider's POST counter) while the first is gone."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from config.settings import Settings
from ratifier.processes import wait_for_log
from ratifier.topics import delete_topics
from runtime.clients import kafka_producer
from schemas.envelopes import BreakerTransition
from schemas.names import Topic
from tests.e2e.conftest import ARTIFACTS, Pipeline, SigningKeys, start_pipeline
from tests.e2e.executor_kit import (
    provider_stats,
    publish_commands,
    refund_command,
    seed_payments,
    wait_terminal,
)
from tests.services import context_token, keyed_call, read_to_end, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

RATE = 50  # calls per second offered (half refunds, half reads)
TICK = 0.1
LOAD, DOWN_AT, UP_AT = 20.0, 6.0, 13.0  # seconds: load, outage start, recovery
BREAKER = "payments:write"
COOLDOWN = 3.0


@pytest.fixture(scope="module")
def outage(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    pipeline = start_pipeline(
        signing_keys,
        "e2e-breakers",
        executors=2,
        audit_sink=True,
        RATIFIER_BREAKERS__WINDOW_SECONDS="5",
        RATIFIER_BREAKERS__MIN_CALLS="10",
        RATIFIER_BREAKERS__COOLDOWN_SECONDS=str(COOLDOWN),
        RATIFIER_BREAKERS__HALF_OPEN_PROBES="2",
    )
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


async def _faults(session: aiohttp.ClientSession, url: str, **faults: Any) -> float:
    async with session.post(f"{url}/_faults", json=faults) as response:
        assert response.status == 200
    return time.time()


async def _load(pipeline: Pipeline) -> dict[str, Any]:
    """Offer refunds (auto-approved, 1 minor unit) and reads at RATE for LOAD seconds; the
    provider answers 503 (nothing applied) from DOWN_AT to UP_AT. Sample its counters every
    0.1 s meanwhile and until 12 s after the recovery."""
    settings = pipeline.settings
    url = pipeline.provider_url
    refunder = context_token(settings, roles=("refund", "refund_auto"))
    reader = context_token(settings, roles=("support",))
    producer = kafka_producer(settings)
    sent: dict[str, str] = {}
    samples: list[tuple[float, int]] = []
    marks: dict[str, float] = {}
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:

        async def sample() -> None:
            while not stop.is_set():
                async with session.get(f"{url}/_stats") as response:
                    samples.append((time.time(), int((await response.json())["posts"])))
                await asyncio.sleep(0.1)  # the sampling period

        sampler = asyncio.create_task(sample())
        await producer.start()
        try:
            started = time.monotonic()
            n = 0
            while (elapsed := time.monotonic() - started) < LOAD:
                if "down" not in marks and elapsed >= DOWN_AT:
                    marks["down"] = await _faults(session, url, fail_before=10**9)
                if "up" not in marks and elapsed >= UP_AT:
                    marks["up"] = await _faults(session, url, fail_before=0)
                for _ in range(int(RATE * TICK)):
                    n += 1
                    call_id = f"br-{uuid.uuid4().hex[:16]}"
                    if n % 2:
                        payment = "pay_A1001" if n % 4 == 1 else "pay_A1002"
                        arguments = {"payment_id": payment, "amount_minor": 1, "reason": "load"}
                        value = keyed_call(call_id, "propose_refund", arguments, call_id, refunder)
                        sent[call_id] = "refund"
                    else:
                        arguments = {"payment_id": "pay_A1001"}
                        value = keyed_call(call_id, "get_payment", arguments, call_id, reader)
                        sent[call_id] = "read"
                    await producer.send(
                        settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
                    )
                await producer.flush()
                # Pacing of the offered load (not a wait for a condition).
                await asyncio.sleep(max(0.0, started + n / RATE - time.monotonic()))
            # Sampling goes on until the breaker had time to close.
            await asyncio.sleep(max(0.0, marks["up"] + 12 - time.time()))
        finally:
            stop.set()
            await sampler
            await producer.stop()
    return {"sent": sent, "samples": samples, **marks}


def _transitions(settings: Settings) -> list[BreakerTransition]:
    def closed(records: list[Any]) -> bool:
        return any(json.loads(r.value)["to_state"] == "closed" for r in records)

    records = run(read_until(settings, [Topic.BREAKERS], closed, timeout=30))
    found = [BreakerTransition.model_validate_json(r.value) for r in records]
    return sorted((t for t in found if t.breaker == BREAKER), key=lambda t: t.at)


def _audited(settings: Settings, expected: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(settings.storage.database_url) as conn:
            rows = conn.execute(
                "SELECT record FROM audit_records WHERE prefix = %s AND stream = 'breakers'",
                (settings.topic_prefix,),
            ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            return [row[0] for row in rows]
        time.sleep(0.2)  # the sink stores records in batches: poll until they are there


def test_a_provider_outage_under_load(outage: Pipeline) -> None:
    settings = outage.settings
    run_ = run(_load(outage))
    sent: dict[str, str] = run_["sent"]
    down, up = run_["down"], run_["up"]
    outcomes = wait_terminal(settings, set(sent), timeout=300)
    transitions = _transitions(settings)
    moves = [(t.from_state, t.to_state, round(t.at.timestamp() - down, 2)) for t in transitions]
    counts: dict[str, int] = {}
    for call_id, found in outcomes.items():
        key = f"{sent[call_id]} {found[-1]['status']} {(found[-1].get('error') or {}).get('code')}"
        counts[key] = counts.get(key, 0) + 1
    report = {"offered": len(sent), "transitions_after_outage_s": moves, "outcomes": counts}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    Path(ARTIFACTS / "breakers-outage.json").write_text(json.dumps(report, indent=2))
    print("provider outage under load:", json.dumps(report))

    # Opened within 5 s of the outage; closed within 10 s of the recovery, and not before.
    opened = [t.at.timestamp() for t in transitions if t.to_state == "open"]
    assert opened and down < opened[0] <= down + 5, moves
    closed = [t.at.timestamp() for t in transitions if t.to_state == "closed"]
    assert closed and up < closed[-1] <= up + 10, moves
    assert transitions[-1].to_state == "closed", moves

    # While open, the provider saw no attempt: its POST counter stood still between a
    # sample taken just after the breaker opened (attempts already on the wire land within
    # milliseconds) and the last sample before it left `open`.
    samples: list[tuple[float, int]] = run_["samples"]
    for begin, end in itertools.pairwise(transitions):
        if begin.to_state != "open":
            continue
        inside = [
            posts for at, posts in samples if begin.at.timestamp() + 0.3 <= at < end.at.timestamp()
        ]
        assert len(set(inside)) <= 1, (begin, end, inside)

    # Every call has one final outcome; refunds refused by the breaker are `unavailable`.
    unavailable = 0
    for call_id, kind in sent.items():
        found = outcomes[call_id]
        # Stages are at-least-once: a record redelivered after a rebalance may repeat an
        # identical outcome (readers dedup by call id); two different ones would be a bug.
        finals = {(o["status"], (o.get("error") or {}).get("code")) for o in found}
        assert len(finals) == 1, found
        outcome = found[0]
        code = (outcome.get("error") or {}).get("code")
        if kind == "read":  # the write breaker leaves reads alone
            assert outcome["status"] == "succeeded", outcome
        elif code == "unavailable":
            unavailable += 1
            assert outcome["status"] == "rejected", outcome
            assert outcome["error"]["retryable"] and outcome["error"]["retry_after"] > 0
        else:
            assert (outcome["status"], code) in {
                ("succeeded", None),
                ("failed", "retry_exhausted"),  # attempted while the outage was being judged
            }, outcome
    assert unavailable > 0, report
    assert counts.get("refund succeeded None", 0) > 0, report

    # Each change of state is an audit row (the sink stores the `breakers` records).
    audited = _audited(settings, len(transitions))
    assert sorted((r["to_state"], r["at"]) for r in audited if r["breaker"] == BREAKER) == sorted(
        (t.to_state, json.loads(t.model_dump_json())["at"]) for t in transitions
    )


def _opened(settings: Settings) -> BreakerTransition:
    """The first transition of the write breaker to `open` on `breakers`."""

    def opened(records: list[Any]) -> bool:
        return any(json.loads(r.value)["to_state"] == "open" for r in records)

    records = run(read_until(settings, [Topic.BREAKERS], opened, timeout=60))
    found = [BreakerTransition.model_validate_json(r.value) for r in records]
    return next(t for t in found if t.breaker == BREAKER and t.to_state == "open")


async def _set_faults(url: str, **faults: Any) -> None:
    async with aiohttp.ClientSession() as session:
        await _faults(session, url, **faults)


@pytest.mark.timeout(240)
def test_a_breaker_opened_by_one_executor_stops_another_without_an_attempt(
    signing_keys: SigningKeys,
) -> None:
    # A long cool-down: the breaker stays open while the second executor takes over.
    pipeline = start_pipeline(
        signing_keys,
        f"e2e-breaker-shared-{uuid.uuid4().hex[:4]}",
        streams=False,
        executors=1,
        RATIFIER_EXECUTOR__CLAIM_LEASE_SECONDS="5",
        RATIFIER_BREAKERS__WINDOW_SECONDS="60",
        RATIFIER_BREAKERS__MIN_CALLS="5",
        RATIFIER_BREAKERS__COOLDOWN_SECONDS="300",
    )
    try:
        settings, url = pipeline.settings, pipeline.provider_url
        seed_payments(settings)
        first = pipeline.worker("executor")
        assert wait_for_log(first, "started on", timeout=120), first.log_tail()
        # The provider fails every refund (503, nothing applied): the first executor's
        # attempts open the breaker.
        run(_set_faults(url, fail_before=10**9))
        failing = [refund_command(f"bs-{uuid.uuid4().hex[:12]}") for _ in range(8)]
        publish_commands(settings, failing)
        opened = _opened(settings)
        assert opened.by.split(":")[1] == str(first.process.pid), opened
        wait_terminal(settings, {c.call_id for c in failing}, timeout=120)

        # A second executor process; the first one leaves: only the second reads commands.
        second = pipeline.start("executor", "executor-2")
        assert wait_for_log(second, "started on", timeout=120), second.log_tail()
        pipeline.stop_worker("executor")
        attempts = provider_stats(url)["posts"]
        refused = [refund_command(f"bs-{uuid.uuid4().hex[:12]}") for _ in range(10)]
        publish_commands(settings, refused)
        outcomes = wait_terminal(settings, {c.call_id for c in refused}, timeout=120)

        stats = provider_stats(url)
        assert stats["posts"] == attempts, "the second executor attempted the provider"
        for command in refused:
            found = outcomes[command.call_id]
            answers = {(o["status"], (o.get("error") or {}).get("code")) for o in found}
            assert answers == {("rejected", "unavailable")}, found
            assert all(o["error"]["retryable"] and o["error"]["retry_after"] > 0 for o in found)
        # It was the second executor that refused them, and the breaker never moved again.
        assert "executor-2" in [w.name for w in pipeline.workers]
        assert "executor" not in [w.name for w in pipeline.workers]
        moves = run(_breaker_moves(settings))
        assert moves == [("closed", "open")], moves
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


async def _breaker_moves(settings: Settings) -> list[tuple[str, str]]:
    records = await read_to_end(settings, [Topic.BREAKERS])
    found = [BreakerTransition.model_validate_json(r.value) for r in records]
    return [(t.from_state, t.to_state) for t in sorted(found, key=lambda t: t.at)]
