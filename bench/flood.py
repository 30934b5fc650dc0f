"""The noisy neighbour, measured inside `make bench` (issue 27): tenant A floods reads under
its 200/s limit while tenant B sends one read every 250 ms; B's median latency during the
flood over its median alone. The scenario is `make test-admission-flood`'s own
(tests/e2e/test_admission.py, its own pipeline on its own topic prefix), run here as a child
process; its figures are taken from the line it prints (``admission figures: {...}``) of
*this* process, never from test-artifacts/admission-flood.json, which any earlier run may have
left behind. The test's own verdict (its bounds) is kept beside the figures.

`python -m bench.flood [N] [--strict]` runs it alone and prints the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from bench.common import LOG_ROOT

FIGURES_LINE = "admission figures: "
TEST = (
    "tests/e2e/test_admission.py::test_a_flood_of_one_tenant_leaves_another_at_its_unloaded_latency"
)


COMMAND = (sys.executable, "-m", "pytest", TEST, "-m", "e2e", "-q", "-s", "-p", "no:cacheprovider")


def shown_command(flood: int, strict: bool) -> str:
    strict_env = " RATIFIER_TEST_FLOOD_STRICT=1" if strict else ""
    return f"RATIFIER_TEST_FLOOD={flood}{strict_env} pytest {TEST} -m e2e -s"


def figures_of(output: str) -> dict[str, Any] | None:
    """The figures the flood test printed (the last such line), None when it printed none."""
    found: dict[str, Any] | None = None
    for line in output.splitlines():
        at = line.find(FIGURES_LINE)
        if at < 0:
            continue
        with contextlib.suppress(ValueError):
            parsed = json.loads(line[at + len(FIGURES_LINE) :])
            if isinstance(parsed, dict):
                found = parsed
    return found


def verdict_of(output: str, returncode: int) -> str:
    """The test's verdict: passed, or failed with its first assertion line."""
    if returncode == 0:
        return "passed"
    failed = next((ln.strip() for ln in output.splitlines() if ln.startswith("E ")), "")
    return f"failed (exit {returncode}){': ' + failed[:200] if failed else ''}"


async def noisy_neighbour(flood: int, strict: bool, run_id: str) -> dict[str, Any]:
    """Run the flood test now and return its figures, tagged with ``run_id``."""
    env = {
        **os.environ,
        "RATIFIER_TEST_FLOOD": str(flood),
        "RATIFIER_TEST_FLOOD_STRICT": "1" if strict else "0",
    }
    log = LOG_ROOT / f"flood-{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await process.communicate()
    except BaseException:
        # Cancelled (the step's time limit): pytest stops its pipeline on SIGINT.
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), timeout=60)
            except TimeoutError:
                process.kill()
                await process.wait()
        raise
    output = out.decode(errors="replace")
    log.write_text(output, encoding="utf-8")
    figures = figures_of(output)
    if figures is None:
        tail = " | ".join(output.strip().splitlines()[-5:])
        raise RuntimeError(f"the flood test printed no figures (log {log}): {tail[:240]}")
    return {
        "flood": {
            **figures,
            "run_id": run_id,
            "test": verdict_of(output, process.returncode or 0),
            "command": shown_command(flood, strict),
            "seconds": round(time.monotonic() - started, 1),
        }
    }


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--strict"]
    flood = int(args[0]) if args else 2_000
    found = asyncio.run(noisy_neighbour(flood, "--strict" in sys.argv, "alone"))
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
