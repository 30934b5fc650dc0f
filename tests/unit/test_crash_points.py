from __future__ import annotations

import pytest

from config.settings import Settings
from executors.crash_points import NO_CRASH_POINTS, CrashPoint
from testsupport.crashing import SigkillAt


def test_production_passes_every_crash_point_and_no_setting_turns_them_on() -> None:
    for point in CrashPoint:
        NO_CRASH_POINTS.reached(point)  # returns: this process is still here
    assert not [n for n in Settings.environment_names() if "CRASH" in n]


def test_a_crash_test_names_its_point_and_probability() -> None:
    assert SigkillAt.parse("after_effect:0.05") == SigkillAt(
        point=CrashPoint.AFTER_EFFECT, probability=0.05
    )
    assert SigkillAt.parse("after_settle").probability == 1.0
    with pytest.raises(ValueError, match="after_nothing"):
        SigkillAt.parse("after_nothing:1")
    # Never at another point, never with probability 0.
    SigkillAt(point=CrashPoint.AFTER_EFFECT).reached(CrashPoint.BEFORE_EFFECT)
    SigkillAt(point=CrashPoint.AFTER_EFFECT, probability=0.0).reached(CrashPoint.AFTER_EFFECT)
