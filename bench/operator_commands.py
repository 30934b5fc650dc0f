"""`make bench-operators`: how long the operator's commands take, start to exit (issue 42:
`ratifier --help` ≤ 0.3 s, `ratifier freeze` ≤ 1 s), each run as an operator runs it — the
installed console script, a process of its own — against a baseline of the same run: the bare
interpreter (`python -c pass`) and the interpreter importing pydantic and aiokafka, the floor
every command that reads settings and talks to Kafka pays.

    python -m bench.operator_commands [--runs 10] [--write]

The commands run on a topic prefix of their own (created, then deleted). ``--write`` keeps the
figures in bench/operator-commands-result.json, which `python -m bench --render` shows in
bench/RESULTS.md ("Operator commands"). The time under load (150 calls/s) is measured by
tests/e2e/test_kill_switch.py, not here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import machine_facts, table
from bench.provenance import current_run_id, not_this_run, origin, read_result, stamped
from config.settings import DEVELOPMENT_MODE_ENV, Settings
from ratifier.topics import delete_topics, ensure_topics
from runtime.identity import context_keys, issue_context_token

RESULT_FILE = Path(__file__).parent / "operator-commands-result.json"
# Targets of issue 42, in seconds from start to exit on an idle machine.
TARGETS = {"--help": 0.3, "freeze": 1.0, "unfreeze": 1.0}


def _script() -> list[str]:
    script = Path(sys.executable).parent / "ratifier"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ratifier.cli"]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}… exited {done.returncode}: {done.stderr}")
    return took


def measure(runs: int) -> dict[str, Any]:
    settings = Settings().model_copy(update={"topic_prefix": f"bops{uuid.uuid4().hex[:8]}."})
    asyncio.run(ensure_topics(settings))
    env = {
        **os.environ,
        "RATIFIER_TOPIC_PREFIX": settings.topic_prefix,
        DEVELOPMENT_MODE_ENV: "true",
    }
    token = issue_context_token(
        context_keys(settings), sub="bench-ops", tenant="tenant-a", roles=("operator",)
    )
    switch = ["--scope", "agent:tenant-a:bench-nobody", "--reason", "bench", "--token", token]
    ratifier = _script()
    commands: dict[str, list[str]] = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "python -c 'import pydantic, aiokafka' (baseline)": [
            sys.executable,
            "-c",
            "import pydantic, aiokafka",
        ],
        "--help": [*ratifier, "--help"],
        "freeze": [*ratifier, "freeze", *switch],
        "unfreeze": [*ratifier, "unfreeze", *switch],
        "freezes": [*ratifier, "freezes"],
        "budgets": [*ratifier, "budgets", "--tenant", "tenant-a"],
        "limits": [*ratifier, "limits"],
        "ops unknown": [*ratifier, "ops", "unknown"],
    }
    started = time.monotonic()
    times: dict[str, list[float]] = {name: [] for name in commands}
    try:
        for run in range(runs):
            for name, argv in commands.items():
                times[name].append(_timed(argv, env))
            print(f"operator commands: run {run + 1}/{runs} done", file=sys.stderr)
    finally:
        asyncio.run(delete_topics(settings))
    return {
        "command": f"python -m bench.operator_commands --runs {runs}",
        "machine": machine_facts(),
        "seconds": round(time.monotonic() - started, 1),
        "runs": runs,
        "rows": [
            {
                "command": name,
                "median_s": round(statistics.median(took), 3),
                "max_s": round(max(took), 3),
                "target_s": TARGETS.get(name),
            }
            for name, took in times.items()
        ],
    }


def section(run_id: str | None) -> list[str]:
    """The "Operator commands" section of bench/RESULTS.md, when it was measured with run
    ``run_id`` (bench.provenance); otherwise a dash and why."""
    r = read_result(RESULT_FILE)
    why_not = not_this_run(
        r, run_id, file="bench/operator-commands-result.json", command="make bench-operators"
    )
    if why_not is not None or r is None:
        return ["## Operator commands", "", f"— {why_not}", ""]
    rows = []
    for row in r["rows"]:
        target = row["target_s"]
        verdict = "-" if target is None else ("met" if row["max_s"] <= target else "NOT met")
        rows.append(
            [
                f"`{row['command']}`" if "baseline" not in row["command"] else row["command"],
                f"{row['median_s']:.2f}",
                f"{row['max_s']:.2f}",
                "-" if target is None else f"≤ {target:.1f}",
                verdict,
            ]
        )
    return [
        "## Operator commands",
        "",
        f"`{r['command']}` = `make bench-operators` ({origin(r)}; {r['machine']}; "
        f"{r['seconds']:.0f} s). "
        f"Each command {r['runs']} times, start to exit, as an operator runs it (the console "
        "script, a process of its own, on a topic prefix of its own), beside the bare "
        "interpreter of the same run. Under 150 calls/s, `ratifier freeze` is measured by "
        'tests/e2e/test_kill_switch.py (docs/kill-switch.md, "Measured").',
        "",
        table(rows, ["command", "median s", "max s", "target", "verdict (max)"]),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_commands")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.runs)
    if args.write:
        RESULT_FILE.write_text(json.dumps(stamped(result), indent=2) + "\n")
        print("\n".join(section(current_run_id())))
    else:
        print(json.dumps(result, indent=2))
    missed = [
        row["command"]
        for row in result["rows"]
        if row["target_s"] is not None and row["max_s"] > row["target_s"]
    ]
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
