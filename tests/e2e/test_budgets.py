"""Spending budgets across a fleet (docs/budgets.md), measured at the payment provider.

- Through the real entry: three agents (their own signed context tokens) propose refunds on
  `calls.proposed`, a human approves each through the approval API, two executors commit
  them against a budget per agent (24 hours). For each agent the provider's applied sum stays
  within the cap; every other refund ends `denied` / `budget_exceeded`, and the numbers add
  up: succeeded calls are exactly the provider's effects, each refusal's message says what
  was left then, and no refused refund would have fitted even in what was left at the end.
- Under load and a crash: three executors, 1,000 concurrent refunds of 1.00-9.99 by one agent
  against a 500.00 daily budget, one executor killed -9 mid-run: the executed sum stays within
  the cap and within one refund of it; every other refund ends `budget_exceeded`. These
  refunds are published as committed commands with signed approval receipts, as the
  approval-join would commit them after a human's approval (tests/e2e/executor_kit.py).

The payments have refundable balance for thousands of refunds, so only the budget limits
them.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from commands.policy import DEFAULT_POLICY_DIR
from ratifier.processes import wait_for_log
from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.approvals_kit import http, terminal_outcomes, token
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.e2e.executor_kit import (
    PAYMENTS,
    executor_pipeline,
    provider_stats,
    publish_commands,
    reconciled_history,
    refund_command,
    seed_payments,
)
from tests.services import publish, read_until, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CAP = 50_000  # 500.00
LARGEST = 999  # 9.99


def budget_policies(
    tmp_path: Path,
    name: str,
    cap: int = CAP,
    window: str = 'window = "day"\ntime_zone = "Europe/Berlin"',
) -> Path:
    """The reference policies with one budget of the refund amount per agent (daily unless
    ``window`` says otherwise)."""
    directory = tmp_path / "policies"
    shutil.copytree(DEFAULT_POLICY_DIR, directory)
    (directory / "budgets.toml").write_text(
        f"""
[[budgets]]
name = "{name}"
tools = ["propose_refund"]
per = ["agent"]
measure = "sum:amount_minor"
cap = {cap}
{window}
""",
        encoding="utf-8",
    )
    return directory


@pytest.fixture
def fleet(signing_keys: SigningKeys, tmp_path: Path) -> Iterator[Pipeline]:
    # A budget of this run only: the test database outlives sessions (same agent, same day).
    name = f"e2e-refunds-{uuid.uuid4().hex[:8]}"
    with executor_pipeline(signing_keys, "budgets", 2, budget_policies(tmp_path, name)) as pipeline:
        yield pipeline


def test_a_thousand_concurrent_refunds_never_pass_a_daily_budget(fleet: Pipeline) -> None:
    rng = random.Random()
    commands = [
        refund_command(f"b-{uuid.uuid4().hex[:12]}", amount=rng.randint(100, LARGEST))
        for _ in range(1000)
    ]
    amount = {c.operation_id: int(c.arguments["amount_minor"]) for c in commands}
    # The third executor SIGKILLs itself right after the provider applied one of its
    # refunds, before the ledger records it (a crash point, testsupport/crashing.py): a
    # kill -9 mid-run with an effect in flight, which its successor finds `effect_pending`
    # and hands to reconciliation as `unknown`.
    victim = fleet.start_crashing("executor", "executor-crashing", at="after_effect:0.3")
    executors = [fleet.worker("executor"), fleet.worker("executor-1"), victim]
    for worker in executors:
        assert wait_for_log(worker, "started on", timeout=120), worker.log_tail()
    publish_commands(fleet.settings, commands)
    deadline = time.monotonic() + 120
    while victim.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert victim.process.poll() == -9, f"no crash:\n{victim.log_tail()}"
    # What it left in flight ends `unknown` and is settled by reconciliation.
    history = reconciled_history(fleet, commands, seconds=240, wait_seconds=240)
    assert history.problems(settled=True) == []

    executed = sum(amount[key] for key in history.effects)
    assert executed <= CAP
    assert executed > CAP - LARGEST
    final = {
        c.call_id: [o for o in history.outcomes[c.call_id] if o["status"] != "unknown"][-1]
        for c in commands
    }
    succeeded = {c.operation_id for c in commands if final[c.call_id]["status"] == "succeeded"}
    assert succeeded == set(history.effects)
    unknown = [
        c for c in commands if any(o["status"] == "unknown" for o in history.outcomes[c.call_id])
    ]
    print(f"executed {executed} of {CAP} in {len(succeeded)} refunds; {len(unknown)} were unknown")
    # The refund in flight at the kill ended `unknown`, held its reservation meanwhile, and
    # was settled by reconciliation (succeeded: the provider had applied it).
    assert unknown
    assert all(final[c.call_id]["status"] == "succeeded" for c in unknown)
    refused = [o for o in final.values() if o["status"] != "succeeded"]
    assert refused, "1,000 refunds of 5.50 on average are about eleven times the budget"
    assert {(o["status"], o["error"]["code"]) for o in refused} == {("denied", "budget_exceeded")}
    assert all("resets at" in o["error"]["message"] for o in refused)


AGENTS = ("agent-b1", "agent-b2", "agent-b3")
AGENT_CAP = 3000  # 30.00 per agent over the last 24 hours
PER_AGENT = 12  # refunds of 1.00-9.99 each: about twice the cap
REMAIN = re.compile(r"needs (\d+) amount_minor, (\d+) of (\d+) remain")


@pytest.fixture
def approving_fleet(signing_keys: SigningKeys, tmp_path: Path) -> Iterator[tuple[Pipeline, str]]:
    """The whole pipeline (streams worker with the approval API, two executors) with a budget
    per agent of this run only (the test database outlives sessions), over the last 24 hours
    (one window for the whole run, even across midnight)."""
    name = f"e2e-agent-refunds-{uuid.uuid4().hex[:8]}"
    window = 'window = "rolling"\nrolling_hours = 24'
    policies = budget_policies(tmp_path, name, cap=AGENT_CAP, window=window)
    pipeline = start_pipeline(
        signing_keys,
        f"budgets-entry-{uuid.uuid4().hex[:4]}",
        executors=2,
        approval_ttl=120,
        RATIFIER_POLICIES__DIRECTORY=str(policies),
    )
    try:
        seed_payments(pipeline.settings)
        yield pipeline, name
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def _propose_refunds(pipeline: Pipeline, rng: random.Random) -> dict[str, tuple[str, int]]:
    """PER_AGENT refunds of each agent on `calls.proposed`, in one interleaved stream, each
    agent with its own context token (refund role: a human must approve); call id → (agent,
    amount)."""
    settings = pipeline.settings
    contexts = {a: token(settings, a, roles=("refund",)) for a in AGENTS}
    proposed: dict[str, tuple[str, int]] = {}
    records: list[tuple[str | None, bytes | None]] = []
    for _ in range(PER_AGENT):
        for agent in AGENTS:
            call_id = f"be-{uuid.uuid4().hex[:12]}"
            amount = rng.randint(100, LARGEST)
            proposed[call_id] = (agent, amount)
            body = {
                "v": 1,
                "call_id": call_id,
                "idempotency_key": call_id,
                "tool": "propose_refund",
                "arguments": {
                    "payment_id": rng.choice(PAYMENTS),
                    "amount_minor": amount,
                    "reason": "budget e2e",
                },
                "context": contexts[agent],
                "proposed_at": datetime.now(UTC).isoformat(),
            }
            records.append((call_id, json.dumps(body).encode()))
    run(publish(settings, records))
    return proposed


def _approve_all(pipeline: Pipeline, call_ids: set[str]) -> None:
    """Once each call waits for a human, a human (not one of the agents) approves it through
    the approval API (POST /approvals/<call>/decision)."""

    def requested(records: list[Any]) -> bool:
        return call_ids <= {json.loads(r.value)["call_id"] for r in records}

    run(read_until(pipeline.settings, [Topic.APPROVALS_REQUESTED], requested, timeout=90))
    boss = token(pipeline.settings, "boss-budgets")
    for call_id in sorted(call_ids):
        status, body = http(
            pipeline, f"/approvals/{call_id}/decision", boss, {"decision": "approve"}
        )
        assert status == 202, (call_id, body)


def _applied_amount(provider_url: str, key: str) -> int:
    """The amount the provider applied under ``key`` (its reconciliation lookup)."""
    url = f"{provider_url}/refunds?idempotency_key={urllib.parse.quote(key)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        refund: dict[str, Any] = json.loads(response.read())
    return int(refund["amount_minor"])


@pytest.mark.timeout(300)
def test_approved_refunds_of_several_agents_never_pass_their_budgets(
    approving_fleet: tuple[Pipeline, str],
) -> None:
    pipeline, name = approving_fleet
    proposed = _propose_refunds(pipeline, random.Random())
    _approve_all(pipeline, set(proposed))
    outcomes = terminal_outcomes(pipeline, set(proposed), timeout=180)

    # The provider's effects are the ground truth: what was applied, and how much.
    by_key = provider_stats(pipeline.provider_url)["by_key"]
    ours = {f"tenant-a:{c}": c for c in proposed}
    applied = {ours[k]: _applied_amount(pipeline.provider_url, k) for k in by_key if k in ours}
    assert all(by_key[f"tenant-a:{c}"] == 1 for c in applied), by_key
    final: dict[str, dict[str, Any]] = {}
    for call_id, ended in outcomes.items():
        assert len({(o["status"], (o.get("error") or {}).get("code")) for o in ended}) == 1, ended
        final[call_id] = ended[-1]

    report: dict[str, dict[str, int]] = {}
    for agent in AGENTS:
        calls = [c for c, (who, _) in proposed.items() if who == agent]
        spent = sum(applied.get(c, 0) for c in calls)
        succeeded = [c for c in calls if final[c]["status"] == "succeeded"]
        refused = [c for c in calls if final[c]["status"] != "succeeded"]
        report[agent] = {
            "offered": sum(proposed[c][1] for c in calls),
            "applied": spent,
            "succeeded": len(succeeded),
            "refused": len(refused),
        }
        # Never past the cap, at the provider.
        assert spent <= AGENT_CAP, (agent, spent, report)
        # Succeeded exactly where the provider applied, the amount proposed.
        assert set(succeeded) == {c for c in calls if c in applied}, agent
        assert all(applied[c] == proposed[c][1] for c in succeeded), agent
        assert len(succeeded) + len(refused) == PER_AGENT
        assert refused, f"{agent} offered about twice its cap: some must be refused"
        for call_id in refused:
            outcome = final[call_id]
            error = outcome["error"]
            assert (outcome["status"], error["code"]) == ("denied", "budget_exceeded"), outcome
            assert outcome["stage"] == "execute", outcome
            assert name in error["message"] and "resets at" in error["message"], error
            said = REMAIN.search(error["message"])
            assert said, error["message"]
            needs, left, cap = (int(g) for g in said.groups())
            # What the refusal said adds up: this call's amount, the cap, what was left then
            # (no less than what is left now: only this agent's refunds count in its window).
            assert needs == proposed[call_id][1] and cap == AGENT_CAP, error["message"]
            assert needs > left >= AGENT_CAP - spent, (error["message"], spent)
    print("budget per agent through calls.proposed:", json.dumps(report))
