"""`ratifier freeze` as an operator runs it (a process of its own) against the real broker:
it prints when the freeze is in force and leaves the record (who, why, no token) on the
`controls` topic; an unreachable broker or a prefix without the topic is one clear line and
exit 2, never a traceback or a 40 s wait. Its speed under load: tests/e2e/test_kill_switch.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from config.settings import DEVELOPMENT_MODE_ENV, Settings
from schemas.names import Topic
from tests.services import context_token, read_until, worker_env

pytestmark = pytest.mark.integration


def _ratifier(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratifier.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **worker_env(settings), DEVELOPMENT_MODE_ENV: "true", **env},
        timeout=60,
        check=False,
    )


def _freeze(settings: Settings, token: str, **env: str) -> subprocess.CompletedProcess[str]:
    args = ["freeze", "--scope", "tool:tenant-a:propose_refund", "--reason", "cli test"]
    return _ratifier(settings, *args, "--token", token, **env)


async def test_freeze_prints_when_it_is_in_force_and_publishes_who_and_why(
    own_settings: Settings,
) -> None:
    token = context_token(own_settings, sub="ops-7", roles=("operator",))
    before = time.time()
    done = _freeze(own_settings, token)
    after = time.time()
    assert done.returncode == 0, done.stderr
    printed = re.search(r"FROZEN tool:tenant-a:propose_refund: in force since (\S+)Z", done.stdout)
    assert printed, done.stdout
    in_force = datetime.fromisoformat(printed.group(1) + "+00:00").timestamp()
    assert before < in_force < after
    assert "by ops-7 (tenant-a): cli test" in done.stdout

    (record,) = await read_until(own_settings, [Topic.CONTROLS], lambda recs: len(recs) >= 1)
    body = json.loads(record.value)
    assert (body["scope"], body["frozen"], body["by"], body["by_tenant"], body["reason"]) == (
        "tool:tenant-a:propose_refund",
        True,
        "ops-7",
        "tenant-a",
        "cli test",
    )
    assert token not in record.value.decode()
    listed = _ratifier(own_settings, "freezes")
    assert "tool:tenant-a:propose_refund" in listed.stdout and "ops-7" in listed.stdout

    lifted = _ratifier(
        own_settings,
        "unfreeze",
        "--scope",
        "tool:tenant-a:propose_refund",
        "--reason",
        "done",
        "--token",
        token,
    )
    assert lifted.returncode == 0 and "unfrozen tool:tenant-a:propose_refund" in lifted.stdout
    assert "0 frozen scope(s)" in _ratifier(own_settings, "freezes").stdout


def test_an_unreachable_broker_or_a_missing_topic_is_one_clear_line(
    own_settings: Settings,
) -> None:
    token = context_token(own_settings, sub="ops-7", roles=("operator",))
    # Loopback's port 9 (discard): no broker listens there.
    down = _freeze(own_settings, token, RATIFIER_KAFKA_BOOTSTRAP="127.0.0.1:9")
    assert down.returncode == 2, down
    assert "Traceback" not in down.stderr
    assert "is not reachable" in down.stderr and "NOT thrown" in down.stderr

    started = time.monotonic()
    elsewhere = _freeze(own_settings, token, RATIFIER_TOPIC_PREFIX="no-such-prefix.")
    assert elsewhere.returncode == 2, elsewhere
    assert "Traceback" not in elsewhere.stderr
    assert "no topic 'no-such-prefix.controls'" in elsewhere.stderr
    # aiokafka alone would retry the metadata for its 40 s request timeout.
    assert time.monotonic() - started < 30

    refused = _freeze(own_settings, context_token(own_settings, roles=("approver",)))
    assert refused.returncode == 2 and "may not freeze" in refused.stderr
