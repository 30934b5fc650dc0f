"""An agent that sends one read every so often through ratifier's client, as an OS process of
its own (tests/e2e/test_admission.py: tenant B while tenant A floods), and times each call as
the agent meets it: from its publication to its final outcome on the agent's own reply topic.

    python -m testsupport.steady_agent TOKEN REPLY_TOPIC COUNT EVERY OUT

Not in the test's process: that one reads every outcome of the run (A's 20,000 among them) to
check that each call has one, and its event loop, busy with A's, delayed B's publication and
B's outcomes by up to 10 ms each in a flood (B's own process, reading its replies only, is
what an agent of another tenant is).

It prints ``ready`` once its client is connected (reply topic REPLY_TOPIC, which must exist);
when a line arrives on stdin, it sends COUNT reads of ``get_payment`` (tenant B's payment),
one every EVERY seconds whatever the earlier ones met (open loop), waits up to
:data:`WAIT_SECONDS` for each final outcome, writes OUT and exits. OUT maps each call id to
``[sent, acknowledged, ended]`` (``time.monotonic()``, one clock for every process of the
machine; ended is null for a call without a final outcome in time) and ``ended_wall_ms``
(``time.time()`` in ms, to compare with record timestamps)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from config.settings import Settings
from ratifier_client.client import CallHandle, RatifierClient
from runtime.heap import settle_heap
from schemas.envelopes import Outcome

WAIT_SECONDS = 60.0


async def steady_calls(
    token: str, reply_topic: str, count: int, every: float
) -> dict[str, list[float | None]]:
    """Send ``count`` reads one every ``every`` seconds; each call's times (module doc)."""
    async with RatifierClient.from_settings(Settings(), reply_topic=reply_topic) as client:
        # Its start-up heap out of collection passes, as every service's (runtime/heap.py): a
        # young process's first full collection walks every module it imported, and held a
        # call of B's publication or outcome up to 50 ms.
        settle_heap("steady-agent")
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        times: dict[str, list[float | None]] = {}

        async def ended(handle: CallHandle) -> None:
            result = await handle.result(within=WAIT_SECONDS)
            if isinstance(result, Outcome):
                times[handle.call_id] += [time.monotonic(), time.time() * 1000]

        waiting = []
        start = time.monotonic()
        for n in range(count):
            await asyncio.sleep(max(0.0, start + n * every - time.monotonic()))
            sent = time.monotonic()
            handle = await client.submit("get_payment", {"payment_id": "pay_B2001"}, context=token)
            times[handle.call_id] = [sent, time.monotonic()]
            waiting.append(asyncio.create_task(ended(handle)))
        await asyncio.gather(*waiting)
    return {c: t if len(t) == 4 else [*t, None, None] for c, t in times.items()}


def main() -> int:
    token, reply_topic, count, every, out = sys.argv[1:6]
    times = asyncio.run(steady_calls(token, reply_topic, int(count), float(every)))
    Path(out).write_text(json.dumps(times), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
