"""The catalogue of breaks (``catalogue.toml``): one-line edits of the code, each with the
check it defeats and the tests that must then fail.

A break names its file, the one line it replaces (compared without its leading and trailing
white space, and found exactly once in the file: a line that moved, changed or appears twice
is catalogue rot, refused loudly) and the line put in its place (indented as the original).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).with_name("catalogue.toml")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
DEFAULT_TIMEOUT = 600.0
DEFAULT_ESTIMATE = 30.0


class CatalogueError(Exception):
    """The catalogue, or one break of it, cannot be applied as written."""


@dataclass(frozen=True, kw_only=True)
class Break:
    """One named one-line break and what must catch it."""

    name: str
    check: str  # the guarantee or check it defeats, in a few words
    file: str  # relative to the repository's root
    original: str
    replacement: str
    # pytest node ids run in the clone; they must fail (pytest exit 1, a failed test).
    tests: tuple[str, ...] = ()
    # Instead of tests: a shell command run in the clone; killed iff it exits with one of
    # ``killed_exit_codes`` (any other non-zero code is an error, not a kill).
    command: str | None = None
    killed_exit_codes: tuple[int, ...] = (1,)
    pytest_args: tuple[str, ...] = ()  # extra pytest arguments (`-m chaos`, `-s`, ...)
    env: Mapping[str, str] = field(default_factory=dict)
    long: bool = False  # run only with `make mutants LONG=1` (or when named in ONLY)
    timeout: float = DEFAULT_TIMEOUT  # seconds before the runner gives up: an error
    estimate: float = DEFAULT_ESTIMATE  # seconds, for the printed estimate
    why: str = ""  # optional: why the named test catches it

    @property
    def target(self) -> str:
        """What must fail, as the table shows it."""
        return self.command if self.command is not None else " ".join(self.tests)


_FIELDS = {
    "name",
    "check",
    "file",
    "original",
    "replacement",
    "tests",
    "command",
    "killed_exit_codes",
    "pytest_args",
    "env",
    "long",
    "timeout",
    "estimate",
    "why",
}


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise CatalogueError(f"{what}: a list of non-empty strings")
    return tuple(value)


def parse_break(entry: Mapping[str, Any]) -> Break:
    """One ``[[break]]`` table as a `Break`, or `CatalogueError` saying what is wrong."""
    label = str(entry.get("name") or "<unnamed>")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise CatalogueError(f"break {label}: unknown keys {sorted(unknown)}")
    for key in ("name", "check", "file", "original", "replacement"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise CatalogueError(f"break {label}: {key!r} must be a non-empty string")
    name = entry["name"]
    if not NAME.match(name):
        raise CatalogueError(f"break {label}: a name of lower-case letters, digits and dashes")
    for key in ("original", "replacement"):
        if "\n" in entry[key].strip():
            raise CatalogueError(f"break {name}: {key!r} must be one line")
    if entry["original"].strip() == entry["replacement"].strip():
        raise CatalogueError(f"break {name}: the replacement is the original line")
    tests = _strings(entry["tests"], f"break {name}: 'tests'") if "tests" in entry else ()
    command = entry.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise CatalogueError(f"break {name}: 'command' must be a non-empty string")
    if bool(tests) == (command is not None):
        raise CatalogueError(f"break {name}: give either 'tests' or 'command'")
    codes = entry.get("killed_exit_codes", [1])
    if (
        not isinstance(codes, list)
        or not codes
        or not all(isinstance(c, int) and c > 0 for c in codes)
    ):
        raise CatalogueError(f"break {name}: 'killed_exit_codes' must list positive codes")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise CatalogueError(f"break {name}: 'env' must map names to strings")
    pytest_args = (
        _strings(entry["pytest_args"], f"break {name}: 'pytest_args'")
        if ("pytest_args" in entry)
        else ()
    )
    numbers: dict[str, float] = {}
    for key, default in (("timeout", DEFAULT_TIMEOUT), ("estimate", DEFAULT_ESTIMATE)):
        value = entry.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise CatalogueError(f"break {name}: {key!r} must be a positive number of seconds")
        numbers[key] = float(value)
    long = entry.get("long", False)
    if not isinstance(long, bool):
        raise CatalogueError(f"break {name}: 'long' must be true or false")
    return Break(
        name=name,
        check=entry["check"].strip(),
        file=entry["file"].strip(),
        original=entry["original"].strip(),
        replacement=entry["replacement"].strip(),
        tests=tests,
        command=command.strip() if command is not None else None,
        killed_exit_codes=tuple(codes),
        pytest_args=pytest_args,
        env=dict(env),
        long=long,
        timeout=numbers["timeout"],
        estimate=numbers["estimate"],
        why=str(entry.get("why", "")).strip(),
    )


def load_catalogue(path: Path = CATALOGUE) -> list[Break]:
    """Every break of the catalogue, in its order; names are unique."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"cannot read {path}: {exc}") from exc
    entries = document.get("break")
    if set(document) - {"break"} or not isinstance(entries, list) or not entries:
        raise CatalogueError(f"{path}: only [[break]] tables, at least one")
    breaks = [parse_break(entry) for entry in entries]
    seen: set[str] = set()
    for found in breaks:
        if found.name in seen:
            raise CatalogueError(f"break {found.name}: the name is used twice")
        seen.add(found.name)
    return breaks


def select(breaks: Sequence[Break], only: Sequence[str], *, long: bool) -> list[Break]:
    """The breaks to run: those named in ``only`` (long or not), else every break but the
    long ones unless ``long``. An unknown name is an error."""
    if only:
        by_name = {b.name: b for b in breaks}
        missing = [n for n in only if n not in by_name]
        if missing:
            raise CatalogueError(f"no break named {', '.join(missing)} (see `make mutants LIST=1`)")
        return [by_name[n] for n in dict.fromkeys(only)]
    return [b for b in breaks if long or not b.long]


def locate(text: str, brk: Break) -> int:
    """The index of the one line of ``text`` that ``brk`` replaces; `CatalogueError` when it
    is missing or appears more than once (catalogue rot)."""
    hits = [i for i, line in enumerate(text.splitlines()) if line.strip() == brk.original]
    if len(hits) != 1:
        where = f"lines {', '.join(str(i + 1) for i in hits)}" if hits else "nowhere"
        raise CatalogueError(
            f"break {brk.name}: its original line is found {where} in {brk.file}, "
            f"not exactly once: {brk.original!r}"
        )
    return hits[0]


def mutated(text: str, brk: Break) -> str:
    """``text`` with ``brk``'s line replaced (same indentation, same line ending)."""
    index = locate(text, brk)
    lines = text.splitlines(keepends=True)
    line = lines[index]
    indent = line[: len(line) - len(line.lstrip())]
    ending = line[len(line.rstrip("\r\n")) :]
    lines[index] = f"{indent}{brk.replacement}{ending}"
    return "".join(lines)


def apply(root: Path, brk: Break) -> int:
    """Apply ``brk`` to the file under ``root``; the 1-based line number it changed."""
    path = root / brk.file
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogueError(f"break {brk.name}: cannot read {brk.file}: {exc}") from exc
    index = locate(text, brk)
    path.write_text(mutated(text, brk), encoding="utf-8")
    return index + 1


def test_functions(node_id: str) -> tuple[str, list[str]]:
    """A node id's file and the names its path names after the file (class, function; a
    parametrization's ``[...]`` dropped)."""
    path, *parts = node_id.split("::")
    return path, [re.sub(r"\[.*\]$", "", part) for part in parts]


def missing_tests(root: Path, brk: Break) -> list[str]:
    """Node ids of ``brk`` whose file, class or function is not in the tree at ``root``."""
    missing = []
    for node_id in brk.tests:
        path, names = test_functions(node_id)
        file = root / path
        if not file.is_file():
            missing.append(node_id)
            continue
        source = file.read_text(encoding="utf-8")
        for name in names:
            if not re.search(rf"^\s*(async\s+def|def|class)\s+{re.escape(name)}\b", source, re.M):
                missing.append(node_id)
                break
    return missing
