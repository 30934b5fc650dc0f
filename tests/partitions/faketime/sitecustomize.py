"""Imported at start-up (PYTHONPATH, `tests.partitions.cluster.clock_ahead`) by the processes
`make partitions` runs with a skewed clock, and by nothing else.

Debian's libfaketime (0.9.10) with FAKETIME_DONT_FAKE_MONOTONIC=1 — the wall clock ahead, the
monotonic clock true, as on a host whose NTP is off — makes Python 3.11's `time.sleep` fail
with EINVAL: Python sleeps with clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), and the
library shifts that deadline by the wall clock's offset (libfaketime issue 426, fixed after
0.9.10). `ratifier streams` polls its children with `time.sleep`, so a skewed streams worker
died at its start: the clock-skew fault ran with no skewed streams worker at all until the row
read each process's clock back. Without faking the monotonic clock, every `threading` wait
with a timeout hangs instead (the library's monotonic clock is then the wall clock). So the
skewed processes sleep through `select`, which the library leaves alone: the same sleep, on
the true monotonic clock. Nothing else of the process changes.
"""

from __future__ import annotations

import os
import select
import time
from typing import SupportsIndex


def _sleep(length: float | SupportsIndex) -> None:
    seconds = float(length)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


if "faketime" in os.environ.get("LD_PRELOAD", ""):
    time.sleep = _sleep
