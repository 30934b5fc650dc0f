"""streams/faust_patches.py: the faust-streaming version the corrections were written against,
hole 1 (never-committed partitions rewound to their beginning) and the guard against duplicate
acknowledged offsets, all against faust-streaming 0.15.3, and hole 4 (a reset offset asked of an
old leader, without fresh metadata) against aiokafka 0.14.0. Hole 2 (resumption order) is in
test_faust_resume.py, hole 3 (in-order delivery after a seek) in test_faust_delivery.py, hole 5
(what is fetched, and fetched again) in test_faust_fetch.py."""

from __future__ import annotations

from functools import partial
from typing import Any

import aiokafka
import faust
import pytest
from aiokafka.consumer.fetcher import Fetcher, OffsetResetStrategy
from aiokafka.errors import KafkaTimeoutError, NotLeaderForPartitionError
from faust.types import TP

from streams import faust_patches
from streams.faust_patches import (
    AIOKAFKA_VERSION,
    FAUST_VERSION,
    _new_offset_without_duplicates,
    _offset_request_refreshing_metadata,
    _seek_to_committed_or_beginning,
    check_faust_version,
    check_version,
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


def test_the_installed_aiokafka_is_the_one_the_corrections_were_written_for() -> None:
    assert aiokafka.__version__ == AIOKAFKA_VERSION == "0.14.0"
    with pytest.raises(ImportError, match=r"aiokafka 0\.14\.0, found 0\.15\.0"):
        check_version("aiokafka", AIOKAFKA_VERSION, "0.15.0")


class MetadataClient:
    def __init__(self) -> None:
        self.refreshes = 0

    def force_metadata_update(self) -> None:
        self.refreshes += 1


def fetcher_resetting(tp: TP) -> tuple[Fetcher, MetadataClient, Any]:
    """An aiokafka 0.14.0 Fetcher with one partition awaiting a reset (no position), and the
    assignment `_update_fetch_positions` reads it from."""
    client = MetadataClient()
    fetcher = Fetcher.__new__(Fetcher)
    fetcher._client = client
    fetcher._retry_backoff = 0
    state = type(
        "State",
        (),
        {
            "has_valid_position": False,
            "awaiting_reset": True,
            "reset_strategy": OffsetResetStrategy.EARLIEST,
        },
    )()
    assignment = type("Assignment", (), {"state_value": lambda _self, _tp: state})()
    return fetcher, client, assignment


async def old_leader(_fetcher: Any, _node_id: int, topic_data: Any) -> Any:
    (topic, partitions), *_ = topic_data.items()
    raise NotLeaderForPartitionError(TP(topic, partitions[0][0]))


async def test_aiokafka_0_14_0_retries_a_reset_against_the_old_leader_without_new_metadata() -> (
    None
):
    """The hole (4. in the module): the reset path logs the failure and retries 100 ms later
    with the same cached leader; nothing asks for fresh metadata."""
    fetcher, client, assignment = fetcher_resetting(NEVER)
    fetcher._proc_offset_request = partial(old_leader, fetcher)
    await Fetcher._update_fetch_positions(fetcher, assignment, 3, [NEVER])
    assert client.refreshes == 0


async def test_hole_4_a_reset_that_met_an_old_leader_refreshes_the_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faust_patches, "_original_proc_offset_request", old_leader)
    fetcher, client, assignment = fetcher_resetting(NEVER)
    fetcher._proc_offset_request = partial(_offset_request_refreshing_metadata, fetcher)
    await Fetcher._update_fetch_positions(fetcher, assignment, 3, [NEVER])
    assert client.refreshes == 1
    # An error that says nothing about metadata asks for nothing.
    monkeypatch.setattr(faust_patches, "_original_proc_offset_request", timed_out)
    with pytest.raises(KafkaTimeoutError):
        await _offset_request_refreshing_metadata(fetcher, 3, {})
    assert client.refreshes == 1


async def timed_out(_fetcher: Any, _node_id: int, _topic_data: Any) -> Any:
    raise KafkaTimeoutError


def test_the_join_asks_aiokafka_for_fresh_metadata_after_a_failed_offset_request() -> None:
    faust_patches.install_faust_patches()
    assert Fetcher._proc_offset_request is _offset_request_refreshing_metadata
