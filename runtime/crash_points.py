"""Crash points: the places where the executor, the reconciler and the approval-join may be
stopped dead, to show that no stop anywhere loses or repeats an effect or an approval
(docs/execution.md, "Crash tests"; docs/approvals.md, "Durability").

Production code reaches them through an injected `CrashPoints`; the default does nothing. The
implementation that SIGKILLs the process is test support (`testsupport/crashing.py`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class CrashPoint(StrEnum):
    GROUP_PREPARED = "group_prepared"  # a write group's ledger work done, not committed
    GROUP_COMMITTED = "group_committed"  # a write group committed, no effect started
    BEFORE_EFFECT = "before_effect"  # claimed in the ledger, effect not started
    AFTER_EFFECT = "after_effect"  # the effect happened, its result not recorded
    AFTER_LEDGER = "after_ledger"  # recorded in the ledger, the outcome not published
    AFTER_PUBLISH = "after_publish"  # outcomes acknowledged, offsets not committed
    AFTER_SETTLE = "after_settle"  # reconciler: settled and committed, not published
    FOLLOWER_STARTED = "follower_started"  # executor: a view follower (side task) starts
    # The approval-join (streams/join_service.py): each step of a batch's transaction, of
    # the publication of what it wrote, and of the publisher of a dead worker's records.
    JOIN_DECIDED = "join_decided"  # states locked and decided, nothing written
    JOIN_WRITTEN = "join_written"  # states, audit and outbox written, not committed
    JOIN_COMMITTED = "join_committed"  # committed, its records not taken to publish
    JOIN_TAKEN = "join_taken"  # records taken (locked), not published
    JOIN_PUBLISHED = "join_published"  # acknowledged by the broker, outbox not cleared
    JOIN_CLEARED = "join_cleared"  # outbox cleared, Kafka offsets not committed
    JOIN_ORPHANS_TAKEN = "join_orphans_taken"  # publisher: a dead worker's records taken
    JOIN_ORPHANS_PUBLISHED = "join_orphans_published"  # publisher: acknowledged, not cleared


class CrashPoints(Protocol):
    def reached(self, point: CrashPoint) -> None:
        """Called as the process passes ``point``; may not return."""


class NoCrashPoints:
    """Production: passing a crash point does nothing."""

    def reached(self, point: CrashPoint) -> None:
        return None


NO_CRASH_POINTS: CrashPoints = NoCrashPoints()
