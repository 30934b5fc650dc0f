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
    sought: dict[Any, int] = {}

    async def committed_offsets(_self: Any, *_partitions: Any) -> dict[TP, int | None]:
        return {NEVER: None, AT_ZERO: 0, AT_FIVE: 5}

    monkeypatch.setattr(faust_patches, "_original_seek", committed_offsets)

    class Consumer:
        async def beginning_offsets(self, partitions: list[Any]) -> dict[Any, int]:
            return dict.fromkeys(partitions, 3)  # retention removed offsets 0..2

        def seek(self, partition: Any, offset: int) -> None:
            sought[partition] = offset

    committed = await _seek_to_committed_or_beginning(Consumer())
    # The beginning as an offset (faust's read offset and the in-order bookkeeping expect
    # it), not a pending reset that a record fetched before the seek could overtake.
    assert committed == {NEVER: 3, AT_ZERO: 3, AT_FIVE: 5}
    assert sought == {NEVER: 3, AT_ZERO: 3}


def test_duplicate_acknowledged_offsets_are_removed_before_the_commit_offset() -> None:
    """faust 0.15.3's `_new_offset` advances one offset per commit when an offset sits twice
    in the acknowledged list (a gap's offsets re-acknowledged)."""
    consumer = type("Consumer", (), {})()
    consumer._acked = {AT_FIVE: [5, 6, 6, 7, 7]}
    consumer._acked_index = {AT_FIVE: {5, 6, 7}}
    consumer._gap = {AT_FIVE: []}
    consumer._committed_offset = {AT_FIVE: 5}
    assert _new_offset_without_duplicates(consumer, AT_FIVE) == 8


def test_the_changelog_created_with_the_topics_is_the_one_faust_uses() -> None:
    """`ratifier topics` creates the join's changelog before faust starts (ratifier/topics.py);
    a name that drifted from faust's would leave faust creating its own again."""
    from config.settings import Settings
    from ratifier.topics import approvals_changelog
    from schemas.names import APPROVAL_TABLE, STREAMS_APP_ID

    settings = Settings(topic_prefix="u.")
    app = faust.App(settings.group(STREAMS_APP_ID), broker="kafka://127.0.0.1:1")
    table = app.Table(APPROVAL_TABLE, default=None, partitions=settings.topic_partitions)
    assert table.changelog_topic.get_topic_name() == approvals_changelog(settings)
