"""deploy/local: `up` is idempotent and a service that cannot start fails fast and readably."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_up_twice_is_harmless_and_status_reports_all_up() -> None:
    started = time.monotonic()
    again = subprocess.run(
        [REPO / "deploy/local/up"], capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert time.monotonic() - started < 30
    status = subprocess.run(
        [REPO / "deploy/local/status"], capture_output=True, text=True, timeout=30, check=False
    )
    assert status.returncode == 0, status.stdout
    assert {line.split()[0] for line in status.stdout.splitlines() if line.strip()} >= {
        "kafka",
        "redis",
        "postgres",
    }


def test_occupied_port_fails_within_bound_naming_the_service(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {
            **os.environ,
            "RATIFIER_LOCAL_HOME": str(tmp_path),
            "RATIFIER_REDIS_PORT": str(port),
            "RATIFIER_REDIS_WAIT": "3",
        }
        started = time.monotonic()
        result = subprocess.run(
            [REPO / "deploy/local/up"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    assert "redis" in (result.stdout + result.stderr).lower()
    assert str(port) in result.stdout + result.stderr
