"""The kill switch on the real pipeline (Kafka, Redis, PostgreSQL, worker processes):
`ratifier freeze`, run as an operator runs it while 150 calls/s flow and the executor has a
backlog (stopped for a while, committed commands waiting for it), returns within 1 s of its
invocation; no effect comes after it (provider counters, matched by the executor's audit
rows); each stage refuses what it holds, counted apart: the executor every command of its
backlog (`frozen` at commit time), the authorizer every later call, together every refund
that did not run; unfreezing restores service; a committed command not started yet is
refused at commit time; an approval in a frozen scope is refused."""

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
from tests.services import context_token, keyed_call, read_to_end, read_until, run, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

OPERATOR = Actor(sub="ops-1", tenant="tenant-a", roles=("operator",))
RATE = 150  # calls per second offered (half refunds, half reads): the load of issue 42
TICK = 0.05
# Seconds of load: with the executor running, with it stopped (a backlog builds up on
# `commands.committed`) before the freeze, and after the freeze returned.
LIVE, BACKLOG, AFTER = 2.0, 2.0, 3.0


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


@dataclass
class Backlogged:
    """What the load met: each call's kind and send time, when the executor had stopped
    (wall clock), and the freeze's timings."""

    sent: dict[str, tuple[str, float]]
    stopped: float
    restarted: float
    freeze: CommandLineFreeze


async def _load_with_freeze(pipeline: Pipeline) -> Backlogged:
    """Offer refunds (auto-approved, 1 minor unit) and reads at RATE. After LIVE seconds,
    stop the executor (the load goes on: committed commands wait on `commands.committed`, a
    backlog); BACKLOG seconds after it stopped, run `ratifier freeze` on `writes:tenant-a`
    while the load goes on; once it returned, start the executor again, and offer load for
    AFTER seconds more."""
    settings = pipeline.settings
    refunder = context_token(settings, roles=("refund", "refund_auto"))
    reader = context_token(settings, roles=("support",))
    producer = kafka_producer(settings)
    await producer.start()
    sent: dict[str, tuple[str, float]] = {}
    stopping: asyncio.Task[None] | None = None
    freezing: asyncio.Task[CommandLineFreeze] | None = None
    stopped = restarted = 0.0
    try:
        started = time.monotonic()
        n = 0
        while not restarted or time.time() < restarted + AFTER:
            elapsed = time.monotonic() - started
            assert elapsed < 120, "the executor did not stop, or the freeze did not return"
            if stopping is None and elapsed >= LIVE:
                stopping = asyncio.create_task(asyncio.to_thread(pipeline.stop_worker, "executor"))
            if stopping is not None and stopping.done() and not stopped:
                await stopping  # its error, if it failed
                stopped = time.time()
            if freezing is None and stopped and time.time() >= stopped + BACKLOG:
                freezing = asyncio.create_task(_freeze_from_the_command_line(pipeline))
            if freezing is not None and freezing.done() and not restarted:
                await freezing  # its error, if it failed
                pipeline.start("executor", "executor")
                restarted = time.time()
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
        if stopping is not None:
            await asyncio.wait({stopping})
        if freezing is not None and not freezing.done():
            freezing.cancel()
            await asyncio.wait({freezing})
        # The session's pipeline keeps its executor, whatever happened here.
        if "executor" not in [w.name for w in pipeline.workers]:
            pipeline.start("executor", "executor")
    return Backlogged(sent=sent, stopped=stopped, restarted=restarted, freeze=freeze)


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _committed_at(settings: Settings, call_ids: set[str]) -> dict[str, float]:
    """When each of ``call_ids`` that was committed got its `commands.committed` record (the
    record's timestamp, wall-clock seconds)."""
    found: dict[str, float] = {}
    for record in run(read_to_end(settings, [Topic.COMMITTED])):
        call_id = json.loads(record.value)["call_id"]
        if call_id in call_ids:
            found.setdefault(call_id, record.timestamp / 1000)
    return found


def test_a_freeze_under_load_with_an_executor_backlog_refuses_at_both_stages(
    pipeline: Pipeline,
) -> None:
    settings = pipeline.settings
    offered = time.monotonic()
    try:
        load = run(_load_with_freeze(pipeline))
        offered = (time.monotonic() - offered) or 1.0
        outcomes = wait_terminal(settings, set(load.sent), timeout=300)
    finally:
        run(_switch(settings, "writes:tenant-a", frozen=False))
    unfrozen = time.time()
    sent, freeze = load.sent, load.freeze
    stats = provider_stats(pipeline.provider_url)
    refunds = {c for c, (kind, _) in sent.items() if kind == "refund"}
    applied = {
        c: _at(stats["applied_at"][f"tenant-a:{c}"])
        for c in refunds
        if f"tenant-a:{c}" in stats["applied_at"]
    }
    committed = _committed_at(settings, refunds)

    invoked, acked = freeze.invoked, freeze.in_force
    # The operator's command returned within 1 s of its invocation, once the broker had the
    # record (the time it printed lies between the two).
    assert freeze.returned - invoked <= 1.0, (round(freeze.returned - invoked, 3), freeze.output)
    assert invoked < acked <= freeze.returned, freeze
    assert load.stopped < invoked < load.restarted, load

    final = {c: found[-1] for c, found in outcomes.items()}
    by_status: dict[tuple[str, str, str | None], int] = {}
    by_stage: dict[str, int] = {}
    for call_id, outcome in final.items():
        code = (outcome.get("error") or {}).get("code")
        key = (sent[call_id][0], outcome["status"], code)
        by_status[key] = by_status.get(key, 0) + 1
        if code == "frozen":
            by_stage[outcome["stage"]] = by_stage.get(outcome["stage"], 0) + 1
    # The executor's backlog when the freeze came: refunds committed before the broker's
    # acknowledgement and not executed (the executor was stopped).
    backlog = {c for c in refunds if c not in applied and committed.get(c, acked) < acked}
    report = {
        "offered_calls": len(sent),
        "offered_per_second": round(len(sent) / offered, 1),
        "seconds_to_offer": round(offered, 2),
        "outcomes": {" ".join(map(str, k)): v for k, v in sorted(by_status.items(), key=str)},
        "frozen_at_stage": by_stage,
        "executor_backlog_at_freeze": len(backlog),
        "effects": len(applied),
        "executor_stopped_before_freeze_s": round(invoked - load.stopped, 3),
        "executor_restarted_after_freeze_s": round(load.restarted - invoked, 3),
        "freeze_command_returned_after_s": round(freeze.returned - invoked, 3),
        "freeze_in_force_after_s": round(acked - invoked, 3),
        "last_effect_before_invocation_s": round(
            invoked - max(applied.values(), default=invoked), 3
        ),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    Path(ARTIFACTS / "kill-switch-load.json").write_text(json.dumps(report, indent=2))
    print("kill switch under load:", json.dumps(report))

    # No effect after the freeze: every one was applied before the command was invoked.
    late = {c: round(t - invoked, 3) for c, t in applied.items() if t >= invoked}
    assert not late, late
    at_authorize, at_execute = set(), set()
    for call_id, (kind, at) in sent.items():
        outcome = final[call_id]
        code = (outcome.get("error") or {}).get("code")
        if kind == "read":  # a writes freeze leaves reads alone
            assert outcome["status"] == "succeeded", outcome
            continue
        if outcome["status"] == "succeeded":
            assert call_id in applied, outcome
            continue
        # Frozen before its effect, no effect at all: a committed command by the executor
        # (at commit time), any other call by the authorizer.
        assert (outcome["status"], code) == ("denied", "frozen"), outcome
        assert call_id not in applied, outcome
        if call_id in committed:
            assert outcome["stage"] == "execute", outcome
            at_execute.add(call_id)
        else:
            assert outcome["stage"] == "authorize", outcome
            at_authorize.add(call_id)
        if at > invoked + 1.0:  # proposed a second after the command: the authorizer's
            assert outcome["stage"] == "authorize", outcome
    # Both stages refused, each what it held: the executor its whole backlog, the authorizer
    # every call it saw after the freeze; together, every refund that did not run.
    assert backlog and backlog <= at_execute, (len(backlog), len(at_execute))
    assert at_authorize, by_stage
    assert by_stage == {"execute": len(at_execute), "authorize": len(at_authorize)}, by_stage
    assert len(at_execute) + len(at_authorize) == len(refunds) - len(applied), report
    assert {c for c in refunds if sent[c][1] > invoked + 1.0} <= at_authorize
    assert applied, by_status  # load was flowing before the executor stopped
    # The audit tells the same story as the provider: each refund the executor recorded as
    # succeeded is an effect the provider applied, and each refund it refused at commit time
    # is recorded `frozen` with no effect.
    recorded = _executed(settings, refunds)
    for call_id in refunds:
        final_status = (final[call_id]["status"], (final[call_id].get("error") or {}).get("code"))
        if final[call_id]["stage"] == "execute" or final_status[0] == "succeeded":
            assert recorded.get(call_id) == [final_status], (call_id, recorded.get(call_id))
        else:  # refused at admission: never reached the executor
            assert call_id not in recorded, (call_id, recorded[call_id])
        assert (recorded.get(call_id) == [("succeeded", None)]) == (call_id in applied), call_id

    # Unfrozen: new calls succeed again (the running executor followed the unfreeze).
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
