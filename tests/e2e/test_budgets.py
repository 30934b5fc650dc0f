"""A spending budget across a fleet (docs/budgets.md): three executors, 1,000 concurrent
refunds of 1.00-9.99 by one agent against a 500.00 daily budget, one executor killed -9
mid-run. Measured at the payment provider: the executed sum stays within the cap and
within one refund of it; every other refund ends `budget_exceeded`.

The refunds are published as committed commands with signed approval receipts, as the
approval-join would commit them after a human's approval (tests/e2e/executor_kit.py): the
budget is decided at the executor's commit, so that is the part run for real here; the
payments have refundable balance for thousands of refunds, so only the budget limits them.
"""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from commands.policy import DEFAULT_POLICY_DIR
from ratifier.processes import wait_for_log
from tests.e2e.conftest import Pipeline, SigningKeys
from tests.e2e.executor_kit import (
    executor_pipeline,
    publish_commands,
    reconciled_history,
    refund_command,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CAP = 50_000  # 500.00
LARGEST = 999  # 9.99


def budget_policies(tmp_path: Path, name: str) -> Path:
    """The reference policies with one daily budget of the refund amount per agent."""
    directory = tmp_path / "policies"
    shutil.copytree(DEFAULT_POLICY_DIR, directory)
    (directory / "budgets.toml").write_text(
        f"""
[[budgets]]
name = "{name}"
tools = ["propose_refund"]
per = ["agent"]
measure = "sum:amount_minor"
cap = {CAP}
window = "day"
time_zone = "Europe/Berlin"
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
