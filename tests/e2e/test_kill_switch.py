"""The kill switch on the real pipeline (Kafka, Redis, PostgreSQL, worker processes):
`ratifier freeze`, run as an operator runs it while 150 calls/s flow, returns within 1 s of
its invocation and no effect starts later than 1 s after the invocation (provider counters,
matched by the executor's audit rows); later calls end `frozen`, unfreezing restores service;
a committed command not started yet is refused at commit time; an approval in a frozen scope
is refused."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from approvals.operators import OperatorRights, throw_switch
from config.settings import Settings
from ratifier.cli import main
from runtime.clients import kafka_producer
from schemas.envelopes import Actor
from schemas.names import Topic
from tests.e2e.approvals_kit import (
    audit,
    decide,
    propose,
    propose_only,
    terminal_outcomes,
    token,
    wait_for,
)
from tests.e2e.conftest import ARTIFACTS, Pipeline
from tests.e2e.executor_kit import provider_stats, wait_terminal
from tests.services import context_token, keyed_call, read_until, run, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

OPERATOR = Actor(sub="ops-1", tenant="tenant-a", roles=("operator",))
RATE = 150  # calls per second offered (half refunds, half reads): the load of issue 42
TICK = 0.05
BEFORE, AFTER = 3.0, 3.0  # seconds of load before and after the freeze


async def _switch(settings: Settings, scope: str, *, frozen: bool) -> float:
    """(Un)freeze ``scope`` as the operator; the wall-clock time of the broker's ack."""
    thrown = await throw_switch(
        settings,
        OperatorRights.from_directory(),
        OPERATOR,
        scope_text=scope,
        frozen=frozen,
        reason="e2e: kill switch",
    )
    return thrown.acknowledged_at.timestamp()


def _ratifier_command() -> list[str]:
    """The `ratifier` an operator runs: the installed console script beside this Python."""
    script = Path(os.environ.get("RATIFIER_BIN") or Path(sys.executable).parent / "ratifier")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ratifier.cli"]


@dataclass(frozen=True, kw_only=True)
class CommandLineFreeze:
    invoked: float  # wall clock, just before the process was spawned
    returned: float  # wall clock, once it exited
    in_force: float  # the time it printed as the freeze's start (the broker's ack)
    output: str


async def _freeze_from_the_command_line(pipeline: Pipeline) -> CommandLineFreeze:
    """`ratifier freeze --scope writes:tenant-a`, a process of its own, as in an incident."""
    operator = context_token(pipeline.settings, sub="ops-1", roles=("operator",))
    args = ["freeze", "--scope", "writes:tenant-a", "--reason", "e2e: kill switch"]
    invoked = time.time()
    process = await asyncio.create_subprocess_exec(
        *_ratifier_command(),
        *args,
        "--token",
        operator,
        env={**os.environ, **pipeline.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    returned = time.time()
    assert process.returncode == 0, err.decode()
    output = out.decode()
    printed = re.search(r"in force since (\S+Z)", output)
    assert printed, output
    in_force = datetime.fromisoformat(printed.group(1).replace("Z", "+00:00")).timestamp()
    return CommandLineFreeze(invoked=invoked, returned=returned, in_force=in_force, output=output)


async def _load_with_freeze(
    pipeline: Pipeline,
) -> tuple[dict[str, tuple[str, float]], CommandLineFreeze]:
    """Offer refunds (auto-approved, 1 minor unit) and reads at RATE for BEFORE + AFTER
    seconds; after BEFORE, run `ratifier freeze` on `writes:tenant-a` while the load goes
    on. Every call's kind and send time, and the freeze's timings."""
    settings = pipeline.settings
    refunder = context_token(settings, roles=("refund", "refund_auto"))
    reader = context_token(settings, roles=("support",))
    producer = kafka_producer(settings)
    await producer.start()
    sent: dict[str, tuple[str, float]] = {}
    freezing: asyncio.Task[CommandLineFreeze] | None = None
    try:
        started = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - started) < BEFORE + AFTER:
            if freezing is None and elapsed >= BEFORE:
                freezing = asyncio.create_task(_freeze_from_the_command_line(pipeline))
            for _ in range(int(RATE * TICK)):
                n += 1
                call_id = f"ks-{uuid.uuid4().hex[:16]}"
                if n % 2:
                    payment = "pay_A1001" if n % 4 == 1 else "pay_A1002"
                    value = keyed_call(
                        call_id,
                        "propose_refund",
                        {"payment_id": payment, "amount_minor": 1, "reason": "load"},
                        call_id,
                        refunder,
                    )
                    kind = "refund"
                else:
                    args = {"payment_id": "pay_A1001"}
                    value = keyed_call(call_id, "get_payment", args, call_id, reader)
                    kind = "read"
                sent[call_id] = (kind, time.time())
                await producer.send(
                    settings.topic(Topic.PROPOSED), key=call_id.encode(), value=value
                )
            await producer.flush()
            # Pacing of the offered load (not a wait for a condition).
            await asyncio.sleep(max(0.0, started + n / RATE - time.monotonic()))
        assert freezing is not None
        freeze = await freezing
    finally:
        await producer.stop()
    return sent, freeze


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_a_freeze_under_load_stops_every_effect_within_a_second(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    offered = time.monotonic()
    try:
        sent, freeze = run(_load_with_freeze(pipeline))
        offered = (time.monotonic() - offered) or 1.0
        outcomes = wait_terminal(settings, set(sent), timeout=300)
    finally:
        run(_switch(settings, "writes:tenant-a", frozen=False))
    unfrozen = time.time()
    stats = provider_stats(pipeline.provider_url)
    ours = {f"tenant-a:{c}" for c, (kind, _) in sent.items() if kind == "refund"}
    applied = {k: _at(t) for k, t in stats["applied_at"].items() if k in ours}

    invoked, acked = freeze.invoked, freeze.in_force
    # The operator's command returned within 1 s of its invocation, once the broker had the
    # record (the time it printed lies between the two), and no effect started later than 1 s
    # after the invocation.
    assert freeze.returned - invoked <= 1.0, (round(freeze.returned - invoked, 3), freeze.output)
    assert invoked < acked <= freeze.returned, freeze
    late = {k: round(t - invoked, 3) for k, t in applied.items() if t > invoked + 1.0}
    assert not late, late

    final = {c: found[-1] for c, found in outcomes.items()}
    by_status: dict[tuple[str, str, str | None], int] = {}
    by_stage: dict[str, int] = {}
    for call_id, outcome in final.items():
        code = (outcome.get("error") or {}).get("code")
        key = (sent[call_id][0], outcome["status"], code)
        by_status[key] = by_status.get(key, 0) + 1
        if code == "frozen":
            by_stage[outcome["stage"]] = by_stage.get(outcome["stage"], 0) + 1
    report = {
        "offered_calls": len(sent),
        "offered_per_second": round(len(sent) / (BEFORE + AFTER), 1),
        "seconds_to_offer": round(offered, 2),
        "outcomes": {" ".join(map(str, k)): v for k, v in sorted(by_status.items(), key=str)},
        "frozen_at_stage": by_stage,
        "effects": len(applied),
        "freeze_command_returned_after_s": round(freeze.returned - invoked, 3),
        "freeze_in_force_after_s": round(acked - invoked, 3),
        "last_effect_after_invocation_s": round(
            max(applied.values(), default=invoked) - invoked, 3
        ),
        "last_effect_after_ack_s": round(max(applied.values(), default=acked) - acked, 3),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    Path(ARTIFACTS / "kill-switch-load.json").write_text(json.dumps(report, indent=2))
    print("kill switch under load:", json.dumps(report))

    for call_id, (kind, at) in sent.items():
        outcome = final[call_id]
        code = (outcome.get("error") or {}).get("code")
        effect = applied.get(f"tenant-a:{call_id}")
        if kind == "read":  # a writes freeze leaves reads alone
            assert outcome["status"] == "succeeded", outcome
            continue
        if outcome["status"] == "succeeded":
            assert effect is not None, outcome
        else:  # frozen before its effect: at admission or at commit time; no effect at all
            assert (outcome["status"], code) == ("denied", "frozen"), outcome
            assert outcome["stage"] in ("authorize", "execute"), outcome
            assert effect is None, outcome
        if at > invoked + 1.0:  # proposed a second after the command: refused
            assert code == "frozen", outcome
    # The audit tells the same story as the provider: each refund the executor recorded as
    # succeeded is an effect the provider applied (so started before the deadline, above), and
    # each refund it refused at commit time is recorded `frozen` with no effect.
    refunds = {c for c, (kind, _) in sent.items() if kind == "refund"}
    recorded = _executed(settings, refunds)
    for call_id in refunds:
        final_status = (final[call_id]["status"], (final[call_id].get("error") or {}).get("code"))
        if final[call_id]["stage"] == "execute" or final_status[0] == "succeeded":
            assert recorded.get(call_id) == [final_status], (call_id, recorded.get(call_id))
        else:  # refused at admission: never reached the executor
            assert call_id not in recorded, (call_id, recorded[call_id])
        assert (recorded.get(call_id) == [("succeeded", None)]) == (
            f"tenant-a:{call_id}" in applied
        ), call_id
    assert by_status.get(("refund", "succeeded", None), 0) > 0, by_status  # load was flowing
    assert by_status.get(("refund", "denied", "frozen"), 0) > 0, by_status

    # Unfrozen: new calls succeed again.
    (again,) = propose_only(pipeline, roles=("refund", "refund_auto"), amount_minor=1)
    (outcome,) = terminal_outcomes(pipeline, {again}, timeout=120)[again]
    assert outcome["status"] == "succeeded", outcome
    applied_again = provider_stats(pipeline.provider_url)["applied_at"][f"tenant-a:{again}"]
    assert _at(applied_again) > unfrozen


def _executed(settings: Settings, call_ids: set[str]) -> dict[str, list[tuple[str, str | None]]]:
    """The executor's `executed` audit rows of ``call_ids``: (status, code) per row."""
    with psycopg.connect(settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT call_id, detail->>'status', detail->>'code' FROM audit_log"
            " WHERE tenant = 'tenant-a' AND kind = 'executed' AND call_id = ANY(%s) ORDER BY id",
            (sorted(call_ids),),
        ).fetchall()
    found: dict[str, list[tuple[str, str | None]]] = {}
    for call_id, status, code in rows:
        found.setdefault(call_id, []).append((status, code))
    return found


def test_a_command_committed_before_the_freeze_is_refused_at_commit_time(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = pipeline.settings
    for name, value in worker_env(settings).items():
        monkeypatch.setenv(name, value)
    operator = context_token(settings, sub="ops-1", roles=("operator",))
    switch = ["--scope", "writes:tenant-a", "--reason", "incident 7", "--token", operator]
    pipeline.stop_worker("executor")
    try:
        (call_id,) = propose_only(pipeline, roles=("refund", "refund_auto"), amount_minor=1)
        run(
            read_until(
                settings,
                [Topic.COMMITTED],
                lambda recs: any(json.loads(r.value)["call_id"] == call_id for r in recs),
                timeout=60,
            )
        )
        # The CLI: a token without the operator role may not; the operator may.
        approver = context_token(settings, sub="boss", roles=("approver",))
        assert main(["freeze", *switch[:-1], approver]) == 2
        assert main(["freeze", *switch]) == 0
        assert main(["freezes"]) == 0
        listed = capsys.readouterr().out
        assert "writes:tenant-a" in listed and "ops-1" in listed and "incident 7" in listed
    finally:
        pipeline.start("executor", "executor")
    try:
        (outcome,) = wait_terminal(settings, {call_id}, timeout=120)[call_id]
        assert outcome["status"] == "denied", outcome
        assert outcome["error"]["code"] == "frozen"
        assert outcome["stage"] == "execute"
        assert f"tenant-a:{call_id}" not in provider_stats(pipeline.provider_url)["by_key"]
    finally:
        assert main(["unfreeze", *switch]) == 0
    (again,) = propose_only(pipeline, roles=("refund", "refund_auto"), amount_minor=1)
    (outcome,) = wait_terminal(settings, {again}, timeout=120)[again]
    assert outcome["status"] == "succeeded", outcome


def test_an_approval_in_a_frozen_scope_is_refused(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    (request,) = propose(pipeline)
    scope = f"subject:tenant-a:{request['subject']}"
    run(_switch(settings, scope, frozen=True))
    try:
        decide(pipeline, request, token(settings, "boss"))
        call_id = request["call_id"]
        (outcome,) = terminal_outcomes(pipeline, {call_id})[call_id]
        assert outcome["status"] == "denied", outcome
        assert outcome["error"]["code"] == "frozen"
        assert outcome["stage"] == "approve"
        assert f"tenant-a:{call_id}" not in provider_stats(pipeline.provider_url)["by_key"]
        wait_for(lambda: "approval_frozen" in [k for k, _ in audit(pipeline, call_id)])
        (detail,) = [d for k, d in audit(pipeline, call_id) if k == "approval_frozen"]
        assert detail["scope"] == scope
        assert detail["frozen_by"] == "ops-1"
    finally:
        run(_switch(settings, scope, frozen=False))
