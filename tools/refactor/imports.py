"""Rewrite dotted module paths across the repository (imports, strings, docs), for moves of
modules between packages. Re-runnable: after merging a branch that still uses an old path,
run the move's script again and it rewrites what the branch added.

    python tools/refactor/imports.py old.module=new.module [...]

A path is replaced where it stands as a whole dotted name (``schemas.settings`` but not
``schemas.settings_extra``); its file form (``schemas/settings.py``) is replaced too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".txt", ".sh", ""}
SKIPPED = ("tools/refactor/",)


def tracked_files() -> list[Path]:
    """The repository's tracked and new (not ignored) text files."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],  # noqa: S607
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    files = []
    for name in listed:
        path = ROOT / name
        if name.startswith(SKIPPED) or not path.is_file():
            continue
        if path.suffix in SUFFIXES or path.name in {"Makefile", "Dockerfile"}:
            files.append(path)
    return files


def rewrite(text: str, moves: Mapping[str, str]) -> str:
    for old, new in moves.items():
        dotted = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])")
        text = dotted.sub(new, text)
        old_file, new_file = old.replace(".", "/"), new.replace(".", "/")
        text = re.sub(rf"(?<![\w/]){re.escape(old_file)}\.py\b", f"{new_file}.py", text)
    return text


def with_external_packages(pyproject: str) -> str:
    """``pyproject``'s import-linter settings with third-party packages in its graph (a
    contract that forbids one needs it)."""
    if "include_external_packages" in pyproject:
        return pyproject
    return pyproject.replace(
        "[tool.importlinter]\n", "[tool.importlinter]\ninclude_external_packages = true\n", 1
    )


def rewrite_repository(moves: Mapping[str, str]) -> list[Path]:
    """Apply ``moves`` to every text file; return the files changed."""
    changed = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, moves)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    moves = dict(arg.split("=", 1) for arg in argv)
    for path in rewrite_repository(moves):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
