"""The mutation catalogue (tests/mutants/catalogue.toml) still fits the code: each break's
original line is found exactly once in its file, its replacement differs, the tests it names
exist. A line that moved or changed is catalogue rot: `make mutants` would refuse the break.
Also the runner's pure parts: the one-line edit, junit matching, the docs table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutants.catalogue import (
    Break,
    CatalogueError,
    load_catalogue,
    locate,
    missing_tests,
    mutated,
    parse_break,
    select,
)
from tests.mutants.report import BEGIN, END, write_docs
from tests.mutants.run import Cases

ROOT = Path(__file__).resolve().parents[2]
BREAKS = load_catalogue()


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_each_break_still_fits_the_code(brk: Break) -> None:
    path = ROOT / brk.file
    assert path.is_file(), f"{brk.name}: {brk.file} is gone"
    text = path.read_text(encoding="utf-8")
    locate(text, brk)  # raises CatalogueError unless exactly once
    changed = [
        (a, b)
        for a, b in zip(text.splitlines(), mutated(text, brk).splitlines(), strict=True)
        if a != b
    ]
    assert len(changed) == 1 and changed[0][1].strip() == brk.replacement
    assert missing_tests(ROOT, brk) == []


def test_the_catalogue_is_big_enough_and_its_names_unique() -> None:
    assert len(BREAKS) >= 25
    assert len({b.name for b in BREAKS}) == len(BREAKS)


ENTRY = {
    "name": "x",
    "check": "c",
    "file": "f.py",
    "original": "a = 1",
    "replacement": "a = 2",
    "tests": ["tests/unit/test_x.py::test_y"],
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"replacement": "  a = 1 "}, "is the original line"),
        ({"tests": []}, "a list of non-empty strings"),
        ({"command": "true"}, "either 'tests' or 'command'"),
        ({"name": "Bad Name"}, "lower-case"),
        ({"original": "a\nb"}, "one line"),
        ({"colour": "red"}, "unknown keys"),
        ({"timeout": 0}, "positive number"),
    ],
)
def test_a_bad_entry_is_refused(change: dict[str, object], problem: str) -> None:
    with pytest.raises(CatalogueError, match=problem):
        parse_break({**ENTRY, **change})


def test_a_line_found_twice_or_nowhere_is_rot() -> None:
    brk = parse_break(ENTRY)
    with pytest.raises(CatalogueError, match="lines 1, 3"):
        locate("a = 1\nb = 2\n  a = 1\n", brk)
    with pytest.raises(CatalogueError, match="nowhere"):
        locate("b = 2\n", brk)
    assert mutated("x\n    a = 1  \r\ny\n", brk) == "x\n    a = 2\r\ny\n"


def test_only_names_long_breaks_too_and_unknown_names_are_refused() -> None:
    short, long = parse_break(ENTRY), parse_break({**ENTRY, "name": "y", "long": True})
    assert select([short, long], [], long=False) == [short]
    assert select([short, long], [], long=True) == [short, long]
    assert select([short, long], ["y"], long=False) == [long]
    with pytest.raises(CatalogueError, match="no break named z"):
        select([short, long], ["z"], long=False)


def test_node_ids_select_their_junit_cases() -> None:
    cases = Cases(
        {
            "tests.unit.test_a::test_f": "passed",
            "tests.unit.test_a::test_f[1]": "failed",
            "tests.unit.test_a::test_fg": "passed",
            "tests.unit.test_a.TestC::test_f": "passed",
            "tests.unit.test_ab::test_f": "passed",
        }
    )
    assert set(cases.matching("tests/unit/test_a.py::test_f")) == {
        "tests.unit.test_a::test_f",
        "tests.unit.test_a::test_f[1]",
    }
    assert set(cases.matching("tests/unit/test_a.py::test_f[1]")) == {
        "tests.unit.test_a::test_f[1]"
    }
    assert set(cases.matching("tests/unit/test_a.py::TestC")) == {"tests.unit.test_a.TestC::test_f"}
    assert len(cases.matching("tests/unit/test_a.py")) == 4


def test_the_docs_table_replaces_only_its_section(tmp_path: Path) -> None:
    doc = tmp_path / "testing.md"
    doc.write_text(f"# Testing\n\nbefore\n\n{BEGIN}\nold\n{END}\n\nafter\n", encoding="utf-8")
    result = {
        "name": "x",
        "check": "a | b",
        "file": "f.py",
        "line": 3,
        "original": "a = x or y",
        "replacement": "a = x | y",
        "target": "tests/unit/test_x.py::test_y",
        "status": "killed",
        "seconds": 4.0,
        "detail": "1 failed",
    }
    document = {
        "command": "make mutants",
        "commit": "0123456789abcdef",
        "date": "2026-01-01T00:00:00+00:00",
        "seconds": 60.0,
        "counts": {"killed": 1, "survived": 0, "error": 0, "not run": 0},
        "results": [result],
    }
    write_docs(doc, document)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Testing\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in text
    assert "| 1 | **x**: a \\| b | `f.py:3`: `a = x or y` → `a = x \\| y` |" in text
    assert "failed as expected (4 s)" in text
