"""bench/RESULTS.md is rendered from the saved results alone (bench/report.py measures
nothing): the committed file is what `python -m bench --render` writes from results.json."""

from __future__ import annotations

from pathlib import Path

from bench.common import RESULTS
from bench.report import VALUES, Results, render


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    results = Results.load()
    copy = tmp_path / "results.json"
    results.save(copy)
    assert copy.read_text(encoding="utf-8") == VALUES.read_text(encoding="utf-8")
    assert Results.load(copy) == results


def test_results_md_is_rendered_from_the_saved_results() -> None:
    assert render(Results.load()) == RESULTS.read_text(encoding="utf-8")
