"""B3 helper process: a faust identity agent, one hop, configured like the streams app
(acks=-1, 3 ms linger, ``take_events`` batches of 500) and doing no work.

``python -m bench.faust_identity SRC DST`` (a faust worker; stops on SIGTERM).
"""

from __future__ import annotations

import sys
from typing import Any

import faust

from config.settings import Settings
from streams.app import BATCH_MAX, BATCH_WITHIN, faust_settings


def main(src: str, dst: str) -> None:
    settings = Settings()
    app = faust.App(settings.group("bench-identity"), **faust_settings(settings), web_enabled=False)
    source = app.topic(src, key_type=bytes, value_type=bytes, internal=False)
    target = app.topic(dst, key_type=bytes, value_type=bytes, internal=False)

    async def identity(stream: Any) -> None:
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN):
            for event in events:
                await target.send(key=event.key, value=event.value)

    app.agent(source, name="identity")(identity)
    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.spinner = None  # as `ratifier streams`: no DEBUG LogRecord per record
    worker.execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
