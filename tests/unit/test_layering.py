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
    wrong.write_text(
        wrong.read_text() + "\nfrom streams.join_service import JoinService  # wrong\n"
    )
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    assert "executors.claims -> streams.join_service" in broken.stdout


# faust left with the approval-join's move to the runtime (issue 44): not a dependency, and
# no module of ours, its tests or its benchmarks imports it (nor mode, its service library).
GONE = ("faust", "mode")


def _imported(path: Path) -> set[str]:
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_faust_in_the_dependencies_or_any_import() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    assert not [d for d in wanted if d.lower().startswith(("faust", "mode"))]
    trees = [*PACKAGES, "tests", "bench", "clients"]
    files = [
        p for tree in trees for p in (ROOT / tree).rglob("*.py") if "node_modules" not in p.parts
    ]
    assert len(files) > 300
    importing = sorted(str(p.relative_to(ROOT)) for p in files if _imported(p) & set(GONE))
    assert importing == []
