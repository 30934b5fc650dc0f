"""Run a ratifier worker that SIGKILLs itself at a crash point (crash tests):

    python -m testsupport.crashing after_effect:0.05 executor
    python -m testsupport.crashing after_settle:1 reconciler
    python -m testsupport.crashing follower_started:raise executor

The first argument is ``point:probability`` (points: runtime/crash_points.py), or
``point:raise`` to raise :class:`InjectedFault` there instead of dying (a side task that
fails, not a process that is killed); the rest is the `ratifier` command line, run with these
crash points injected."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ratifier.cli import main as ratifier_main
from runtime.crash_points import CrashPoint

log = logging.getLogger("ratifier.crash-test")


class InjectedFault(RuntimeError):
    """Raised at a crash point by ``point:raise``."""


@dataclass(frozen=True, kw_only=True)
class RaiseAt:
    """Raise :class:`InjectedFault` each time the process passes ``point``."""

    point: CrashPoint

    def reached(self, point: CrashPoint) -> None:
        if point == self.point:
            log.error("crash test: raising at %s", point)
            raise InjectedFault(f"injected fault at {point}")


@dataclass(frozen=True, kw_only=True)
class SigkillAt:
    """Kill this process with SIGKILL at ``point``, each time with ``probability``."""

    point: CrashPoint
    probability: float = 1.0

    @classmethod
    def parse(cls, spec: str) -> SigkillAt:
        point, _, rate = spec.partition(":")
        return cls(point=CrashPoint(point), probability=float(rate or "1"))

    def reached(self, point: CrashPoint) -> None:
        if point == self.point and random.random() < self.probability:  # noqa: S311 - test fault
            log.error("crash test: SIGKILL at %s", point)
            os.kill(os.getpid(), signal.SIGKILL)


def crash_points_of(spec: str) -> SigkillAt | RaiseAt:
    point, _, how = spec.partition(":")
    if how == "raise":
        return RaiseAt(point=CrashPoint(point))
    return SigkillAt.parse(spec)


def main(argv: Sequence[str] | None = None) -> int:
    spec, *command = sys.argv[1:] if argv is None else argv
    return ratifier_main(command, crash_points=crash_points_of(spec))


if __name__ == "__main__":
    sys.exit(main())
