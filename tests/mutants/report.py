"""The mutants table of docs/testing.md, between its markers, from a run's JSON document."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

BEGIN = "<!-- mutants:begin (written by `make mutants`; edit the catalogue, not this table) -->"
END = "<!-- mutants:end -->"

SHOWN = {
    "killed": "failed as expected",
    "survived": "**SURVIVED**",
    "error": "**ERROR**",
    "not run": "not run (long)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"``{text}``" if "`" in text else f"`{text}`"


def _tests(target: str) -> str:
    parts = target.split()
    if any(p.startswith("tests/") for p in parts):
        return "<br>".join(_code(p) for p in parts)
    return _code(target)


def table(document: Mapping[str, Any]) -> str:
    """The section: what was run, when, on which commit, and one row per break."""
    counts = document["counts"]
    lines = [
        BEGIN,
        "",
        f"Latest run: `{document['command']}` on commit `{document['commit'][:10]}`, "
        f"{document['date']}: {counts['killed']} of {len(document['results'])} breaks failed "
        f"their test as expected, {counts['survived']} survived, {counts['error']} errors"
        + (f", {counts['not run']} long ones not run" if counts.get("not run") else "")
        + f"; {round(document['seconds'] / 60, 1)} min in all.",
        "",
        "| # | Check | Break (file: original → replacement) | Test that must fail | Result |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(document["results"], 1):
        where = f"{r['file']}:{r['line']}" if r.get("line") else r["file"]
        result = SHOWN.get(r["status"], r["status"])
        if r["status"] in ("killed", "survived"):
            result += f" ({r['seconds']:.0f} s)"
        if r["status"] == "error":
            result += f": {_cell(r['detail'][:200])}"
        lines.append(
            f"| {i} | **{_cell(r['name'])}**: {_cell(r['check'])} "
            f"| `{where}`: {_code(r['original'])} → {_code(r['replacement'])} "
            f"| {_tests(r['target'])} | {result} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def write_docs(path: Path, document: Mapping[str, Any]) -> None:
    """Replace the section between the markers of ``path`` (appended when it has none)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    section = table(document)
    start, end = text.find(BEGIN), text.find(END)
    if start >= 0 and end > start:
        text = text[:start] + section + text[end + len(END) :]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section + "\n"
    path.write_text(text, encoding="utf-8")
