"""A virtualenv holding the agent-side distribution (`ratifier-client`) and nothing of the
server: what `make client` tests it in and the clean-venv e2e test runs docs/agents.md's
example with. Built once per content of clients/python and schemas/ (a stamp of their hash),
so CI pays pip (from its wheel cache) once and a rerun only checks the stamp.

    python -m tests.client_venv        # print the venv's python, building it when stale
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT_DIR = ROOT / "clients" / "python"
VENV_DIR = ROOT / ".venv-client"
SOURCES = (CLIENT_DIR / "pyproject.toml", CLIENT_DIR / "ratifier_client", ROOT / "schemas")


def source_hash() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        files = [source] if source.is_file() else sorted(source.rglob("*.py"))
        for path in files:
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def client_python(*, extras: str = "test") -> Path:
    """The clean venv's interpreter, (re)built when the distribution's sources changed."""
    python = VENV_DIR / "bin" / "python"
    stamp = VENV_DIR / f".ratifier-client-{source_hash()}-{extras}"
    if stamp.exists():
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
    with tempfile.TemporaryDirectory() as wheels:
        # The wheel is built by the dev venv's pip (isolated, from its cache); the clean venv
        # then installs it and its dependencies only (pip's wheel cache makes that fast).
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
             "-w", wheels, str(CLIENT_DIR)],
            check=True,
        )  # fmt: skip
        wheel = next(Path(wheels).glob("ratifier_client-*.whl"))
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--force-reinstall", f"{wheel}[{extras}]"],
            check=True,
        )  # fmt: skip
    for old in VENV_DIR.glob(".ratifier-client-*"):
        old.unlink()
    stamp.touch()
    return python


if __name__ == "__main__":
    print(client_python())
