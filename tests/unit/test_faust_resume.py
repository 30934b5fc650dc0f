"""Hole 2 of streams/faust_patches.py (faust-streaming 0.15.3): the corrected order of
faust's resumption after a rebalance: seek to the committed offsets, resume the flow, and only
then fetch from the stream partitions again."""

from __future__ import annotations

import asyncio
from typing import Any

from faust.tables.recovery import Recovery

from streams import faust_patches
from streams.faust_patches import (
    _on_recovery_completed_in_order,
    _resume_streams_in_order,
    install_faust_patches,
)

# faust's own method, as it was before any correction was installed in this process.
ORIGINAL_ON_RECOVERY_COMPLETED = faust_patches._original_on_recovery_completed

STREAM, CHANGELOG = ("t.calls.authorized", 1), ("t-approvals-changelog", 1)


class Recorder:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, name: str, result: Any = None) -> Any:
        def record(*_args: Any, **_kwargs: Any) -> Any:
            self.steps.append(name)
            return result

        return record


def fake_recovery(steps: Recorder, generation: int = 3) -> Any:
    async def seek() -> None:
        steps.steps.append("seek")

    async def on_rebalance_complete_send() -> None:
        return None

    async def maybe_start() -> None:
        steps.steps.append("fetcher")

    async def wait(coro: Any, timeout: float | None = None) -> None:
        await coro

    consumer = type(
        "Consumer",
        (),
        {
            "assignment": staticmethod(lambda: {STREAM, CHANGELOG}),
            "perform_seek": staticmethod(seek),
            "resume_flow": staticmethod(steps.step("resume_flow")),
            "resume_partitions": staticmethod(
                lambda tps: steps.steps.append(f"resume_partitions {sorted(tps)}")
            ),
        },
    )
    app = type(
        "App",
        (),
        {
            "consumer": consumer,
            "consumer_generation_id": generation,
            "conf": type("Conf", (), {"broker_request_timeout": 5.0}),
            "on_rebalance_complete": type(
                "Signal", (), {"send": staticmethod(on_rebalance_complete_send)}
            ),
            "flow_control": type("Flow", (), {"resume": staticmethod(steps.step("flow"))}),
            "_fetcher": type("Fetcher", (), {"maybe_start": staticmethod(maybe_start)}),
            "on_rebalance_end": staticmethod(steps.step("end")),
        },
    )
    tables = type(
        "Tables",
        (),
        {
            "on_actives_ready": staticmethod(lambda: None),
            "on_standbys_ready": staticmethod(lambda: None),
        },
    )
    return type(
        "Recovery",
        (),
        {
            "app": app,
            "tables": tables,
            "completed": asyncio.Event(),
            "log": type(
                "Log",
                (),
                {
                    "info": staticmethod(lambda *a: None),
                    "dev": staticmethod(lambda *a: None),
                    "warning": staticmethod(steps.step("stale")),
                },
            ),
            "_wait": staticmethod(wait),
            "_is_changelog_tp": staticmethod(lambda tp: tp == CHANGELOG),
        },
    )()


# The corrected order (2. in streams/faust_patches.py): nothing is fetched while nothing is taken.
SEEK_FLOW_THEN_PARTITIONS = [
    "seek",
    "flow",
    "resume_flow",
    f"resume_partitions {[STREAM]}",
    "fetcher",
    "end",
]


async def test_partitions_resume_after_the_seek_and_the_flow() -> None:
    steps = Recorder()
    await _resume_streams_in_order(fake_recovery(steps), generation_id=3)
    assert steps.steps == SEEK_FLOW_THEN_PARTITIONS


async def test_a_stale_generation_resumes_nothing() -> None:
    steps = Recorder()
    await _resume_streams_in_order(fake_recovery(steps, generation=4), generation_id=3)
    assert steps.steps == ["stale"]


def completing_recovery(steps: Recorder, generation: int = 3) -> Any:
    """``fake_recovery`` with what `Recovery.on_recovery_completed` also uses (no tables)."""
    recovery = fake_recovery(steps, generation)
    recovery.app.assignor = type("Assignor", (), {"assigned_standbys": staticmethod(set)})
    recovery.tables.values = staticmethod(lambda: [])
    recovery.actives_for_table = {}
    recovery.standbys_for_table = {}
    recovery._set_recovery_ended = lambda: None
    return recovery


async def test_faust_0_15_3_resumes_partitions_before_the_seek_after_a_table_recovery() -> None:
    """The hole, in faust-streaming 0.15.3's own `Recovery.on_recovery_completed` (the path
    of every app with a table: the join's): a later faust that fixed it fails this test, so
    the correction is re-checked."""
    steps = Recorder()
    await ORIGINAL_ON_RECOVERY_COMPLETED(completing_recovery(steps), generation_id=3)
    assert steps.steps.index(f"resume_partitions {[STREAM]}") < steps.steps.index("seek")


async def test_after_a_table_recovery_partitions_resume_after_the_seek_and_the_flow() -> None:
    steps = Recorder()
    await _on_recovery_completed_in_order(completing_recovery(steps), generation_id=3)
    assert steps.steps == SEEK_FLOW_THEN_PARTITIONS


def test_the_join_runs_the_corrected_resumption() -> None:
    install_faust_patches()
    assert Recovery.on_recovery_completed is _on_recovery_completed_in_order
    assert Recovery._resume_streams is _resume_streams_in_order
