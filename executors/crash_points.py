"""Crash points: the places where the executor and the reconciler may be stopped dead, to show
that no stop anywhere loses or repeats an effect (docs/execution.md, "Crash tests").

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


class CrashPoints(Protocol):
    def reached(self, point: CrashPoint) -> None:
        """Called as the process passes ``point``; may not return."""


class NoCrashPoints:
    """Production: passing a crash point does nothing."""

    def reached(self, point: CrashPoint) -> None:
        return None


NO_CRASH_POINTS: CrashPoints = NoCrashPoints()
