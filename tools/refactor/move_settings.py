"""Issue 26 item 4: `schemas` holds the wire contract only. This moves out what is not
contract and rewrites every import of it across the repository, in one step:

- settings          schemas/settings.py  -> config/settings.py   (a new bottom package)
- identity (JWT)    schemas/identity.py  -> runtime/identity.py
- AsyncAPI renderer schemas/asyncapi.py  -> ratifier/asyncapi.py
- the export CLI    schemas/export.py    -> ratifier/contract_export.py

and adds the import-linter contract that `schemas` imports no third-party package but
pydantic. Re-runnable and idempotent: after merging a branch that still imports
`schemas.settings` (or adds to a moved file), run it again; a file already moved is not moved
again, and a file a merge brought back at the old path is moved over the new one only when
the new one is missing (otherwise the script stops and says so).

    python tools/refactor/move_settings.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from imports import ROOT, rewrite_repository, with_external_packages

FILES = {
    "schemas/settings.py": "config/settings.py",
    "schemas/identity.py": "runtime/identity.py",
    "schemas/asyncapi.py": "ratifier/asyncapi.py",
    "schemas/export.py": "ratifier/contract_export.py",
}
MODULES = {
    "schemas.settings": "config.settings",
    "schemas.identity": "runtime.identity",
    "schemas.asyncapi": "ratifier.asyncapi",
    "schemas.export": "ratifier.contract_export",
}
CONFIG_INIT = '''"""ratifier's configuration: the one frozen settings model
(`config.settings.Settings`), read once at start from ``RATIFIER_*`` environment variables.
It sits just above the wire contract (`schemas`), so that every package may read settings."""
'''
# Third-party packages of the server that the contract must not import (import-linter can
# only forbid; tests/unit/test_contract_imports.py allows exactly pydantic and the stdlib).
SERVER_DEPENDENCIES = [
    "aiokafka", "faust", "mode", "redis", "psycopg", "psycopg_pool", "tenacity", "cedarpy",
    "jwt", "mcp", "aiohttp", "prometheus_client", "opentelemetry", "pydantic_settings",
]  # fmt: skip
CONTRACT_PURE = """
[[tool.importlinter.contracts]]
name = "The contract (schemas) imports no third-party package but pydantic"
type = "forbidden"
source_modules = ["schemas"]
forbidden_modules = [
{modules}
]
"""


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)  # noqa: S603, S607


def move_files() -> None:
    for old, new in FILES.items():
        source, target = ROOT / old, ROOT / new
        if not source.exists():
            continue
        if target.exists():
            raise SystemExit(f"{old} and {new} both exist: merge them by hand, then re-run")
        target.parent.mkdir(parents=True, exist_ok=True)
        git("mv", old, new)
    init = ROOT / "config" / "__init__.py"
    if not init.exists():
        init.write_text(CONFIG_INIT)
        git("add", str(init.relative_to(ROOT)))


def fix_moved_files() -> None:
    """What a plain rename does not carry: the export CLI's renderer import and its output
    directory (the contract's JSON files stay in schemas/json)."""
    export = ROOT / "ratifier" / "contract_export.py"
    text = export.read_text()
    text = text.replace(
        "from schemas import asyncapi\n", "import schemas\nfrom ratifier import asyncapi\n"
    )
    text = text.replace(
        'DEFAULT_DIR = Path(__file__).parent / "json"',
        'DEFAULT_DIR = Path(schemas.__file__).parent / "json"',
    )
    export.write_text(text)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if new not in text and old in text:
        path.write_text(text.replace(old, new, 1))


def fix_configuration() -> None:
    pyproject = ROOT / "pyproject.toml"
    text = with_external_packages(pyproject.read_text())
    text = re.sub(
        r'root_packages = \[\n  "schemas", "ratifier_client",(?! "config")',
        'root_packages = [\n  "schemas", "ratifier_client", "config",',
        text,
    )
    text = re.sub(
        r'  "ratifier_client",\n  "schemas",\n\]',
        '  "config | ratifier_client",\n  "schemas",\n]',
        text,
    )
    # The layers' temporary exception (identity verified the client's proofs from schemas).
    text = re.sub(
        r"ignore_imports = \[\n  # Until identity leaves the contract[^\]]*\]\n", "", text
    )
    text = text.replace(
        "  # The server's side of the contract package, which the client distribution does not "
        "need.\n"
        '  "config.settings", "runtime.identity", "ratifier.asyncapi", '
        '"ratifier.contract_export",\n',
        '  "config",\n',
    )
    text = text.replace(
        'include = ["ratifier_client*", "approvals*"',
        'include = ["ratifier_client*", "config*", "approvals*"',
    )
    text = text.replace(
        '"clients/python/tests", "approvals",', '"clients/python/tests", "config", "approvals",'
    )
    for section in (
        'source_modules = [\n  "schemas", "ratifier_client", "telemetry",',
        'ancestors = [\n  "schemas", "ratifier_client", "telemetry",',
    ):
        text = text.replace(
            section,
            section.replace(
                '"ratifier_client", "telemetry"', '"ratifier_client", "config", "telemetry"'
            ),
        )
    # The contract imports neither the client distribution nor the settings.
    name = 'name = "The contract (schemas) imports nothing of ours"'
    start = text.index(name)
    head, tail = text[:start], text[start:]
    listed = tail.index("forbidden_modules = [")
    if '"config"' not in tail[listed : tail.index("]", listed)]:
        tail = tail.replace(
            "forbidden_modules = [\n  ", 'forbidden_modules = [\n  "ratifier_client", "config", ', 1
        )
    text = head + tail
    if "imports no third-party package but pydantic" not in text:
        modules = ",\n".join(f'  "{m}"' for m in SERVER_DEPENDENCIES)
        marker = '\n[[tool.importlinter.contracts]]\nname = "Catalog plugins'
        text = text.replace(marker, CONTRACT_PURE.format(modules=modules) + marker, 1)
    pyproject.write_text(text)
    edit(
        ROOT / "Dockerfile",
        "COPY schemas/ schemas/\n",
        "COPY schemas/ schemas/\nCOPY config/ config/\n",
    )


def tidy(paths: list[Path]) -> None:
    """Imports re-sorted and formatted as `make lint` wants (a module that moved between
    packages sorts elsewhere), with the ruff of the interpreter running this script."""
    ruff = Path(sys.executable).with_name("ruff")
    python = [str(p) for p in paths if p.suffix == ".py" and p.exists()]
    if not ruff.exists() or not python:
        return
    fix = [str(ruff), "check", "--fix", "-q", "--select", "I,F401", *python]
    subprocess.run(fix, cwd=ROOT, check=False)  # noqa: S603
    subprocess.run([str(ruff), "format", "-q", *python], cwd=ROOT, check=False)  # noqa: S603


def main() -> int:
    move_files()
    fix_moved_files()
    changed = rewrite_repository(MODULES)
    for path in changed:
        print(path.relative_to(ROOT))
    fix_configuration()
    tidy([*changed, *(ROOT / new for new in FILES.values())])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
