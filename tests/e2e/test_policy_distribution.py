from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from commands.reference import catalog
from feeds.policies import policy_record, publish_policies
from ratifier.policy_replay import replay
from runtime.clients import kafka_producer
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import PolicySetRecord
from schemas.names import Topic
from tests.e2e.conftest import Pipeline
from tests.services import outcomes_by_call, read_until, run, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FORBID_A1002 = """
@id("freeze-pay_A1002")
forbid (principal, action == Action::"get_payment", resource)
when { context.arguments.payment_id == "pay_A1002" };
"""


def candidate_dir(tmp_path: Path) -> Path:
    target = tmp_path / "candidate"
    shutil.copytree(DEFAULT_POLICY_DIR, target)
    (target / "freeze.cedar").write_text(FORBID_A1002)
    return target


async def stream_calls(
    pipeline: Pipeline, prefix: str, count: int, rate: float, midway: Any
) -> dict[str, str]:
    """Publish ``count`` get_payment calls at ``rate``/s, alternating two payments; call
    ``midway()`` half way through. Returns call_id → payment_id."""
    settings = pipeline.settings
    token = issue_context_token(
        context_keys(settings), sub="agent-h", tenant="tenant-a", roles=("support",)
    )
    producer = kafka_producer(settings)
    await producer.start()
    sent: dict[str, str] = {}
    try:
        for n in range(count):
            if n == count // 2:
                await midway()
            payment = "pay_A1002" if n % 2 else "pay_A1001"
            call_id = f"{prefix}-{n}"
            body = {
                "v": 1,
                "call_id": call_id,
                "tool": "get_payment",
                "arguments": {"payment_id": payment},
                "context": token,
                "proposed_at": datetime.now(UTC).isoformat(),
            }
            await producer.send(
                settings.topic(Topic.PROPOSED),
                key=call_id.encode(),
                value=json.dumps(body).encode(),
            )
            sent[call_id] = payment
            await asyncio.sleep(1 / rate)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def wait_outcomes(pipeline: Pipeline, ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    records = run(
        read_until(
            pipeline.settings,
            [Topic.OUTCOMES],
            lambda recs: ids <= set(outcomes_by_call(recs)),
            timeout=60,
        )
    )
    found = outcomes_by_call(records)
    return {i: found[i] for i in ids}


def test_hot_swap_refusal_and_replay(pipeline: Pipeline, tmp_path: Path) -> None:
    settings = pipeline.settings
    started = datetime.now(UTC) - timedelta(seconds=1)
    default = PolicySet.from_directory()
    candidate_path = candidate_dir(tmp_path)
    candidate = PolicySet.from_directory(candidate_path)
    prefix = f"hs-{uuid.uuid4().hex[:8]}"

    async def swap() -> None:
        await publish_policies(settings, policy_record(settings, candidate))

    sent = run(stream_calls(pipeline, prefix, count=300, rate=120, midway=swap))
    outcomes = wait_outcomes(pipeline, set(sent))

    versions_seen = set()
    for call_id, payment in sent.items():
        terminal = [o for o in outcomes[call_id] if o["status"] != "awaiting_approval"]
        assert len(terminal) == 1, (call_id, outcomes[call_id])
        (o,) = terminal
        versions_seen.add(o["policy_version"])
        if payment == "pay_A1001" or o["policy_version"] == default.version:
            # Decided under the old set (or unaffected): runs; a command authorized under the
            # old set may meet the new one at commit time and is refused there.
            assert o["status"] == "succeeded" or (
                o["error"]["code"] == "precondition_failed" and payment == "pay_A1002"
            ), o
        else:
            assert o["policy_version"] == candidate.version
            assert (o["status"], o["error"]["code"]) == ("denied", "policy_denied"), o
    assert versions_seen == {default.version, candidate.version}

    # An invalid set is refused: the candidate stays in force.
    broken = PolicySetRecord(
        name=settings.policies.set_name,
        policies="permit (principal,",
        cedar_schema={},
        version="sha256:broken",
        published_at=datetime.now(UTC),
    )
    run(publish_policies(settings, broken))
    after = run(stream_calls(pipeline, f"{prefix}-after", count=6, rate=50, midway=_noop))
    later = wait_outcomes(pipeline, set(after))
    for call_id, payment in after.items():
        o = later[call_id][0]
        assert o["policy_version"] == candidate.version
        assert o["status"] == ("denied" if payment == "pay_A1002" else "succeeded")
    streams_log = next(w for w in pipeline.workers if w.name == "streams").log_tail(2000)
    assert "REFUSED policy set sha256:broken" in streams_log

    # Replay over this test's proposals: exactly the pay_A1002 calls change decision.
    report = run(
        replay(
            settings,
            catalog=catalog,
            keys=context_keys(settings),
            current=default,
            candidate=candidate,
            since=started,
            progress=False,
        )
    )
    expected = {c for c, p in {**sent, **after}.items() if p == "pay_A1002"}
    assert report.changed_calls == expected
    assert dict(report.changes) == {("permit/auto", "deny"): len(expected)}

    # Put the default set back for the rest of the session, then the CLI replay agrees.
    run(publish_policies(settings, policy_record(settings, default)))
    probes = wait_for_version(pipeline, f"{prefix}-restore", default.version)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratifier.cli",
            "policy",
            "replay",
            "--policies",
            str(candidate_path),
            "--since",
            started.isoformat(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **worker_env(settings)},
    )
    assert cli.returncode == 0, cli.stderr
    changed = expected | {c for c, p in probes.items() if p == "pay_A1002"}
    assert re.search(rf"permit/auto → deny\s+{len(changed)}\s", cli.stdout), cli.stdout
    assert re.search(rf"total changed\s+{len(changed)}$", cli.stdout, re.M), cli.stdout


async def _noop() -> None:
    return None


def wait_for_version(pipeline: Pipeline, prefix: str, version: str) -> dict[str, str]:
    """Send pairs of probe calls until one is decided under ``version``; return all sent."""
    sent: dict[str, str] = {}
    for attempt in range(40):
        batch = run(stream_calls(pipeline, f"{prefix}-{attempt}", count=2, rate=50, midway=_noop))
        sent.update(batch)
        if any(
            o[0]["policy_version"] == version for o in wait_outcomes(pipeline, set(batch)).values()
        ):
            return sent
    raise AssertionError(f"policy version {version} never took effect")
