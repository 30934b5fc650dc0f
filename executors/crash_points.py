"""The crash points (runtime/crash_points.py), where the executor and the reconciler reach
them from."""

from __future__ import annotations

from runtime.crash_points import NO_CRASH_POINTS as NO_CRASH_POINTS
from runtime.crash_points import CrashPoint as CrashPoint
from runtime.crash_points import CrashPoints as CrashPoints
from runtime.crash_points import NoCrashPoints as NoCrashPoints
