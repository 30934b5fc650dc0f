"""A pytest plugin the mutation runner loads in every pytest process of a clone (through
``PYTEST_PLUGINS``, so workers' and commands' pytest runs too): it proves that the code under
test is the clone's, not the editable install's (``.venv`` maps ratifier's packages to the
main working tree; a mutant importing that code would survive, or fail, for nothing).

At start-up, every package of ours must resolve inside the clone, and the mutated file must
hold its replacement; at the end, every module of ours that was imported must come from the
clone. The verdict is appended to ``RATIFIER_TEST_MUTANT_GUARD_FILE`` as one JSON line; a problem
also stops the session (a usage error, exit 4), which the runner reports as an error.

The runner copies this file next to the clone under another module name: it must not import
anything of the repository itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT_ENV = "RATIFIER_TEST_MUTANT_ROOT"
FILE_ENV = "RATIFIER_TEST_MUTANT_GUARD_FILE"
MUTATED_ENV = "RATIFIER_TEST_MUTANT_FILE"  # relative path of the mutated file, if any
REPLACEMENT_ENV = "RATIFIER_TEST_MUTANT_REPLACEMENT"

PACKAGES = (
    "approvals",
    "audit",
    "commands",
    "config",
    "dashboard",
    "examples",
    "executors",
    "feeds",
    "ratifier",
    "ratifier_client",
    "runtime",
    "schemas",
    "streams",
    "telemetry",
    "testsupport",
    "tests",
)


def _inside(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(root)
    except ValueError:
        return False
    return True


def _record(verdict: dict[str, Any]) -> None:
    target = os.environ.get(FILE_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), **verdict}) + "\n")


def start_problems(root: Path) -> list[str]:
    """Packages resolving outside ``root``, and a mutated file missing its replacement."""
    problems = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if spec is None or not locations or not all(_inside(p, root) for p in locations):
            problems.append(f"package {name} resolves to {locations or spec} outside {root}")
    mutated, replacement = os.environ.get(MUTATED_ENV), os.environ.get(REPLACEMENT_ENV)
    if mutated and replacement is not None:
        text = (root / mutated).read_text(encoding="utf-8")
        if not any(line.strip() == replacement for line in text.splitlines()):
            problems.append(f"{mutated} in the clone does not hold the replacement line")
    return problems


def end_problems(root: Path) -> list[str]:
    """Modules of our packages imported from anywhere but ``root``."""
    problems = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in PACKAGES or module is None:
            continue
        origin = getattr(module, "__file__", None)
        if origin is None:
            paths = list(getattr(module, "__path__", []) or [])
            if paths and all(_inside(p, root) for p in paths):
                continue
            problems.append(f"module {name} has no file inside {root} ({paths})")
        elif not _inside(origin, root):
            problems.append(f"module {name} imported from {origin}")
    return problems


def pytest_configure(config: pytest.Config) -> None:
    raw = os.environ.get(ROOT_ENV)
    if not raw:
        return
    root = Path(raw).resolve()
    problems = start_problems(root)
    _record({"phase": "start", "root": str(root), "problems": problems})
    if problems:
        raise pytest.UsageError("mutation guard: " + "; ".join(problems))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    raw = os.environ.get(ROOT_ENV)
    if not raw:
        return
    root = Path(raw).resolve()
    problems = end_problems(root)
    ours = sorted(n for n in sys.modules if n.split(".")[0] in PACKAGES and n != "tests")
    _record({"phase": "end", "root": str(root), "problems": problems, "modules": len(ours)})
