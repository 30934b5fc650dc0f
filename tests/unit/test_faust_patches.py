"""streams/faust_patches.py: the faust-streaming version the corrections were written against,
hole 1 (never-committed partitions rewound to their beginning) and the guard against duplicate
acknowledged offsets. Hole 2 (resumption order) is in test_faust_resume.py, hole 3 (in-order
delivery after a seek) in test_faust_delivery.py; all of them against faust-streaming 0.15.3."""

from __future__ import annotations

from typing import Any

import faust
import pytest
from faust.types import TP

from streams import faust_patches
from streams.faust_patches import (
    FAUST_VERSION,
    _new_offset_without_duplicates,
    _seek_to_committed_or_beginning,
    check_faust_version,
)

NEVER, AT_ZERO, AT_FIVE = (
    TP("t.approvals.decided", 0),
    TP("t.approvals.decided", 1),
    TP("t.approvals.decided", 2),
)


def test_the_installed_faust_is_the_one_the_corrections_were_written_for() -> None:
    assert faust.__version__ == FAUST_VERSION == "0.15.3"


def test_another_faust_version_refuses_to_load_the_corrections() -> None:
    check_faust_version(FAUST_VERSION)
    with pytest.raises(ImportError, match=r"re-check each hole"):
        check_faust_version("0.15.4")


async def test_hole_1_never_committed_partitions_are_rewound_to_their_beginning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka's seek_to_committed (under faust 0.15.3) does not move a partition whose
    committed offset is None or 0: a record fetched meanwhile and dropped is never fetched
    again."""
    sought_to_beginning: list[Any] = []

    async def committed_offsets(_self: Any, *_partitions: Any) -> dict[TP, int | None]:
        return {NEVER: None, AT_ZERO: 0, AT_FIVE: 5}

    monkeypatch.setattr(faust_patches, "_original_seek", committed_offsets)

    class Consumer:
        async def seek_to_beginning(self, *partitions: Any) -> None:
            sought_to_beginning.extend(partitions)

    committed = await _seek_to_committed_or_beginning(Consumer())
    assert committed == {NEVER: None, AT_ZERO: 0, AT_FIVE: 5}
    assert sorted(sought_to_beginning) == [NEVER, AT_ZERO]


def test_duplicate_acknowledged_offsets_are_removed_before_the_commit_offset() -> None:
    """faust 0.15.3's `_new_offset` advances one offset per commit when an offset sits twice
    in the acknowledged list (a gap's offsets re-acknowledged)."""
    consumer = type("Consumer", (), {})()
    consumer._acked = {AT_FIVE: [5, 6, 6, 7, 7]}
    consumer._acked_index = {AT_FIVE: {5, 6, 7}}
    consumer._gap = {AT_FIVE: []}
    consumer._committed_offset = {AT_FIVE: 5}
    assert _new_offset_without_duplicates(consumer, AT_FIVE) == 8
