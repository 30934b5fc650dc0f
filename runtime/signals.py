"""SIGTERM and SIGINT ask a service to stop gracefully (finish the batch, commit, close)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: Callable[[], object]) -> None:
    """Call ``stop`` on SIGTERM or SIGINT (in the running event loop)."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT."""
    event = asyncio.Event()
    stop_on_signals(event.set)
    return event
