"""Issue 26 item 4: `commands` does no Kafka I/O. What follows or publishes the fleet's
compacted topics moves to the `feeds` package (above `commands`, below `approvals` and the
services), the pure parts stay:

- commands/policy_feed.py -> feeds/policies.py (the policy feed, publish, status)
- commands/freezes.py's `FleetFreezes` and `publish_freeze` -> feeds/freezes.py (the scopes,
  the view and `frozen_scope` stay in commands/freezes.py)

and rewrites every import. Re-runnable after a merge (a branch still importing the old
places gets rewritten; moved code is not moved twice).

    python tools/refactor/move_feeds.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from imports import ROOT, rewrite_repository, tracked_files, with_external_packages

MOVED_NAMES = ("FleetFreezes", "publish_freeze")
FEEDS_INIT = '''"""What every process follows of the fleet's compacted topics and publishes to them:
the policy set in force (`policies`) and the freezes in force (`controls`). The decisions on
them are pure and live in `commands`; this package is their Kafka edge."""
'''
FREEZES_HEADER = '''"""The freezes in force in this process, followed from the compacted
`controls` topic, and the publishing of a freeze (docs/kill-switch.md). Which call a freeze
stops is decided by the pure `commands.freezes.frozen_scope`."""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from commands.freezes import NO_FREEZES, Freezes, applied
from runtime.clients import kafka_producer
from runtime.reader import TopicReader
from schemas.envelopes import FreezeRecord
from schemas.names import Topic
from schemas.settings import Settings

log = logging.getLogger("ratifier.freezes")


'''

COMMANDS_PURE = """
[[tool.importlinter.contracts]]
name = "The catalog and its decisions (commands) do no Kafka I/O"
type = "forbidden"
source_modules = ["commands"]
forbidden_modules = [
  "aiokafka", "faust", "feeds", "runtime.clients", "runtime.reader", "runtime.publish",
  "runtime.loop",
]
include_external_packages = true
"""


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)  # noqa: S603, S607


def block(text: str, start: str) -> tuple[int, int]:
    """The span of the top-level definition starting with ``start`` (to the next one)."""
    a = text.index(start)
    following = re.search(r"\n\n\n(?=\S)", text[a:])
    return a, (a + following.start() + 3) if following else len(text)


def move_modules() -> None:
    (ROOT / "feeds").mkdir(exist_ok=True)
    init = ROOT / "feeds" / "__init__.py"
    if not init.exists():
        init.write_text(FEEDS_INIT)
        git("add", "feeds/__init__.py")
    if (ROOT / "commands" / "policy_feed.py").exists():
        git("mv", "commands/policy_feed.py", "feeds/policies.py")
    pure = ROOT / "commands" / "freezes.py"
    text = pure.read_text()
    moved = []
    for start in ("class FleetFreezes:", "async def publish_freeze("):
        if start in text:
            a, b = block(text, start)
            moved.append(text[a:b].rstrip() + "\n")
            text = text[:a] + text[b:]
    if moved:
        target = ROOT / "feeds" / "freezes.py"
        existing = target.read_text() if target.exists() else FREEZES_HEADER
        target.write_text(existing.rstrip() + "\n\n\n" + "\n\n".join(moved))
        pure.write_text(text.rstrip() + "\n")
        git("add", "feeds/freezes.py")


IMPORT = re.compile(r"^(\s*)from commands\.freezes import (\([^)]*\)|[^\n]*)$", re.M)


def split_imports(source: str) -> str:
    def replace(match: re.Match[str]) -> str:
        indent, names_text = match.group(1), match.group(2)
        names = [n.strip() for n in names_text.strip("()").replace("\n", " ").split(",")]
        names = [n for n in names if n]
        stay = [n for n in names if n.split(" as ")[0] not in MOVED_NAMES]
        go = [n for n in names if n.split(" as ")[0] in MOVED_NAMES]
        if not go:
            return match.group(0)
        lines = [f"{indent}from commands.freezes import {', '.join(stay)}"] if stay else []
        lines.append(f"{indent}from feeds.freezes import {', '.join(go)}")
        return "\n".join(lines)

    return IMPORT.sub(replace, source)


def rewrite_imports() -> None:
    for path in tracked_files():
        if path.suffix != ".py" or path.is_relative_to(ROOT / "tools" / "refactor"):
            continue
        text = path.read_text()
        new = split_imports(text)
        if new != text:
            path.write_text(new)
            print(path.relative_to(ROOT))
    for path in rewrite_repository({"commands.policy_feed": "feeds.policies"}):
        print(path.relative_to(ROOT))


def fix_configuration() -> None:
    pyproject = ROOT / "pyproject.toml"
    text = with_external_packages(pyproject.read_text())
    if '"feeds"' not in text:
        text = text.replace('"commands", "approvals",', '"commands", "feeds", "approvals",')
        text = text.replace(
            '  "approvals",\n  "commands",\n', '  "approvals",\n  "feeds",\n  "commands",\n'
        )
        text = text.replace('"commands*", "streams*"', '"commands*", "feeds*", "streams*"')
        text = text.replace(
            '"runtime", "commands", "streams",', '"runtime", "commands", "feeds", "streams",'
        )
    if "(commands) do no Kafka I/O" not in text:
        marker = '\n[[tool.importlinter.contracts]]\nname = "Catalog plugins'
        text = text.replace(marker, COMMANDS_PURE + marker, 1)
    pyproject.write_text(text)
    dockerfile = ROOT / "Dockerfile"
    text = dockerfile.read_text()
    if "COPY feeds/" not in text:
        text = text.replace(
            "COPY commands/ commands/\n", "COPY commands/ commands/\nCOPY feeds/ feeds/\n"
        )
        dockerfile.write_text(text)


if __name__ == "__main__":
    move_modules()
    rewrite_imports()
    fix_configuration()
