"""The layering contracts (import-linter, run by `make lint`) catch a wrong import."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The root packages import-linter checks that live at the top of the repository (the client
# distribution's, under clients/python, is found installed).
PACKAGES = tuple(
    name
    for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "root_packages"
    ]
    if (ROOT / name).is_dir()
)


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_service_importing_another_service_breaks_the_layers(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint_imports(tmp_path).returncode == 0
    wrong = tmp_path / "executors" / "claims.py"
    wrong.write_text(wrong.read_text() + "\nfrom streams.app import create_app  # wrong\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    assert "executors.claims -> streams.app" in broken.stdout
