"""The agent-side distribution alone: a virtualenv holding only `ratifier-client` (no faust,
psycopg, cedarpy, ... nor this repository on its path) runs docs/agents.md's example
against a real pipeline, as an agent developer would after `pip install ratifier-client`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.client_venv import ROOT, client_python
from tests.e2e.conftest import Pipeline
from tests.services import context_token

pytestmark = pytest.mark.e2e

SECTION = "## From zero to a guarded tool call: the Python client"


def agents_md_example() -> str:
    """The first Python block of docs/agents.md's client section, as printed there."""
    text = (ROOT / "docs" / "agents.md").read_text()
    section = text[text.index(SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def test_the_documented_example_runs_in_a_venv_with_only_the_client(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    python = client_python()
    # Nothing of the server is importable there: the venv is the client's alone.
    probe = subprocess.run(
        [str(python), "-c", "import faust"], cwd=tmp_path, capture_output=True, check=False
    )
    assert probe.returncode != 0
    example = agents_md_example()
    code = [line for line in example.splitlines() if line.strip()]
    assert len(code) <= 16  # "ten lines", give or take the imports
    script = tmp_path / "agent.py"
    script.write_text(example)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RATIFIER_KAFKA__BOOTSTRAP": pipeline.settings.kafka.bootstrap,
        "RATIFIER_TOPIC_PREFIX": pipeline.settings.topic_prefix,
        "AGENT_CONTEXT_TOKEN": context_token(pipeline.settings),
    }
    done = subprocess.run(
        [str(python), str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("succeeded")
    assert "pay_A1001" in done.stdout
