"""`make mutants`: each break of the catalogue applied alone in a temporary clone of one
commit, and the tests it names run there; they must fail.

    python -m tests.mutants [--only a,b] [--long] [--list] [--commit REV] [--keep] [--no-docs]

Per break: a fresh ``git clone`` of the commit (HEAD by default, pinned at the start: commits
made meanwhile change nothing), the one-line edit, a check that ratifier's packages import from
the clone and not from the editable install ``.venv`` points at, then the named tests with
``.venv``'s interpreter, the clone as working directory and first on ``PYTHONPATH``.
Verdicts: *killed* (pytest exit 1 with at least one failed test; for a command, one of its
``killed_exit_codes``), *survived* (the tests passed: a check to strengthen), *error*
(anything else: collection or usage errors, no test run, a timeout of the runner, code
imported from outside the clone, catalogue rot, a control that did not pass).

Before the breaks, a control runs the same tests on the unmutated clone once: a test that
fails without any break would "kill" every break, so its breaks are errors instead.

Output: progress per break, a summary, ``test-artifacts/mutants.json`` and, for a run of the
whole catalogue, the table in ``docs/testing.md``. Exit 1 if any break survived or erred.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.mutants import guard
from tests.mutants.catalogue import (
    CATALOGUE,
    Break,
    CatalogueError,
    apply,
    load_catalogue,
    locate,
    missing_tests,
    select,
)
from tests.mutants.report import write_docs

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
RESULTS = ARTIFACTS / "mutants.json"
LOGS = ARTIFACTS / "mutants"
GUARD_MODULE = "ratifier_mutant_guard"
PYTEST_BASE = ("-p", "no:cacheprovider", "-q", "-rfE")

KILLED, SURVIVED, ERROR, NOT_RUN = "killed", "survived", "error", "not run"


@dataclass
class Cases:
    """What a junit report says: per test case (``module[.Class]::name``), its outcome."""

    outcomes: dict[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def matching(self, node_id: str) -> dict[str, str]:
        """The cases a node id selects (a file, a class, a function and its parameters)."""
        path, *parts = node_id.split("::")
        module = path.removesuffix(".py").replace("/", ".")
        found = {}
        for case, outcome in self.outcomes.items():
            where, _, name = case.rpartition("::")
            if where != module and not where.startswith(f"{module}."):
                continue
            # The case's path below its module: classes, then the test's name.
            rest = [c for c in where[len(module) :].split(".") if c] + [name]
            if parts:
                if len(rest) < len(parts) or rest[: len(parts) - 1] != parts[:-1]:
                    continue
                last, got = parts[-1], rest[len(parts) - 1]
                if "[" in last and (got != last or len(rest) != len(parts)):
                    continue
                if "[" not in last and got.split("[")[0] != last:
                    continue
            found[case] = outcome
        return found


def read_junit(path: Path) -> Cases:
    cases = Cases()
    if not path.is_file():
        return cases
    try:
        root = ET.parse(path).getroot()  # written by our own pytest run
    except ET.ParseError:
        return cases
    for case in root.iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                break
        if outcome == "error" and cases.outcomes.get(key) == "failed":
            continue  # a teardown error after a failure: the failure counts
        cases.outcomes[key] = outcome
    return cases


@dataclass
class Run:
    """One process run in a clone."""

    exit_code: int | None  # None: timed out (the runner killed it)
    seconds: float
    cases: Cases
    guard: list[dict[str, Any]]
    log: Path


@dataclass
class Result:
    name: str
    check: str
    file: str
    line: int | None
    original: str
    replacement: str
    target: str
    long: bool
    status: str
    seconds: float
    detail: str
    failed_tests: list[str] = field(default_factory=list)


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def environment(
    clone: Path, guard_dir: Path, guard_file: Path, brk: Break | None
) -> dict[str, str]:
    """The clone's environment: its code first on the path (before the editable install's
    finder), the guard loaded by every pytest process, development mode as in the Makefile."""
    env = dict(os.environ)
    paths = [str(clone), str(clone / "clients" / "python"), str(guard_dir)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    plugins = [p for p in env.get("PYTEST_PLUGINS", "").split(",") if p]
    env["PYTEST_PLUGINS"] = ",".join([GUARD_MODULE, *plugins])
    # A command's `python`, `pytest`, `ratifier` are .venv's (the clone has no .venv), and so
    # is the interpreter of the deploy scripts that take one (deploy/partitions/cluster: PY).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PY"] = sys.executable
    env.setdefault("RATIFIER_DEVELOPMENT_MODE", "true")
    env[guard.ROOT_ENV] = str(clone)
    env[guard.FILE_ENV] = str(guard_file)
    env.pop(guard.MUTATED_ENV, None)
    env.pop(guard.REPLACEMENT_ENV, None)
    env.pop("PYTEST_ADDOPTS", None)
    if brk is not None:
        env[guard.MUTATED_ENV] = brk.file
        env[guard.REPLACEMENT_ENV] = brk.replacement
        env.update(brk.env)
    return env


@contextmanager
def clone_of(commit: str, *, keep: bool) -> Iterator[Path]:
    """A fresh clone of ``commit`` in a temporary directory, and a guard next to it."""
    base = Path(tempfile.mkdtemp(prefix="ratifier-mutant-"))
    clone = base / "repo"
    try:
        git("clone", "--quiet", "--no-checkout", str(REPO), str(clone))
        git("checkout", "--quiet", "--detach", commit, cwd=clone)
        guard_dir = base / "guard"
        guard_dir.mkdir()
        shutil.copyfile(Path(guard.__file__), guard_dir / f"{GUARD_MODULE}.py")
        yield clone
    finally:
        if keep:
            print(f"    kept {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)


def guard_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def sanity(clone: Path, env: dict[str, str]) -> list[str]:
    """Where the clone's interpreter finds ratifier's packages: inside the clone, and the
    mutated file holding its replacement (problems, empty when all is well)."""
    probe = (
        f"import json, pathlib, sys; import {GUARD_MODULE} as g; "
        "print(json.dumps(g.start_problems(pathlib.Path(sys.argv[1]).resolve())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(clone)],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return [f"sanity probe failed: {done.stderr.strip()[-500:]}"]
    problems: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return problems


def execute(
    argv: Sequence[str], *, clone: Path, env: dict[str, str], timeout: float, log: Path
) -> tuple[int | None, float]:
    """Run ``argv`` in ``clone`` in its own process group (killed whole on a timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n(cwd {clone})\n\n")
        out.flush()
        process = subprocess.Popen(
            list(argv), cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
            out.write(f"\n[runner] timed out after {timeout:.0f} s: process group killed\n")
    return code, time.monotonic() - started


def run_in(
    clone: Path,
    brk: Break | None,
    *,
    tests: Sequence[str],
    command: str | None,
    pytest_args: Sequence[str],
    extra_env: dict[str, str],
    stop_first: bool,
    timeout: float,
    log: Path,
) -> Run:
    base = clone.parent
    junit = base / "junit.xml"
    guard_file = base / "guard.jsonl"
    for stale in (junit, guard_file):
        stale.unlink(missing_ok=True)
    env = environment(clone, base / "guard", guard_file, brk)
    env.update(extra_env)
    problems = sanity(clone, env)
    if problems:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("sanity check failed:\n" + "\n".join(problems) + "\n", encoding="utf-8")
        return Run(
            exit_code=None,
            seconds=0.0,
            cases=Cases(),
            guard=[{"phase": "sanity", "problems": problems}],
            log=log,
        )
    if command is not None:
        argv: list[str] = ["bash", "-c", command]
    else:
        argv = [sys.executable, "-m", "pytest", *PYTEST_BASE, f"--junitxml={junit}"]
        argv += ["-x"] if stop_first else []
        argv += [*pytest_args, *tests]
    code, seconds = execute(argv, clone=clone, env=env, timeout=timeout, log=log)
    return Run(
        exit_code=code,
        seconds=seconds,
        cases=read_junit(junit),
        guard=guard_records(guard_file),
        log=log,
    )


def guard_problem(run: Run, *, pytest_run: bool) -> str | None:
    problems = [p for record in run.guard for p in record.get("problems", [])]
    if problems:
        return "code under test not the clone's: " + "; ".join(problems)[:400]
    if (
        pytest_run
        and run.exit_code is not None
        and not any(r.get("phase") == "start" for r in run.guard)
    ):
        return "the clone guard did not run in pytest"
    return None


def verdict(brk: Break, run: Run) -> tuple[str, str, list[str]]:
    """(status, detail, failed tests) of a mutant's run."""
    failed = sorted(c for c, o in run.cases.outcomes.items() if o == "failed")
    problem = guard_problem(run, pytest_run=brk.command is None)
    if problem:
        return ERROR, problem, failed
    if run.exit_code is None:
        return ERROR, f"runner timeout after {brk.timeout:.0f} s", failed
    if brk.command is not None:
        if run.exit_code in brk.killed_exit_codes:
            return KILLED, f"exit {run.exit_code}", failed
        if run.exit_code == 0:
            return SURVIVED, "the command passed", failed
        return ERROR, f"exit {run.exit_code}, not one of {list(brk.killed_exit_codes)}", failed
    if run.exit_code == 1 and failed:
        return KILLED, f"{len(failed)} failed", failed
    if run.exit_code == 0:
        passed = run.cases.count("passed")
        return SURVIVED, f"{passed} passed", failed
    errors = run.cases.count("error")
    if run.exit_code == 1:
        return ERROR, f"pytest exit 1 with {errors} errors and no failed test", failed
    return ERROR, f"pytest exit {run.exit_code} (not a test failure)", failed


def control_problem(brk: Break, run: Run) -> str | None:
    """Why the unmutated run does not show ``brk``'s tests passing, or None."""
    problem = guard_problem(run, pytest_run=brk.command is None)
    if problem:
        return problem
    if brk.command is not None:
        return None if run.exit_code == 0 else f"control: the command exits {run.exit_code}"
    for node_id in brk.tests:
        cases = run.cases.matching(node_id)
        if not cases:
            return f"control: {node_id} ran no test (exit {run.exit_code})"
        bad = {c: o for c, o in cases.items() if o != "passed"}
        if bad:
            shown = ", ".join(f"{c} {o}" for c, o in sorted(bad.items())[:3])
            return f"control: not passing without the break: {shown}"
    if run.exit_code is None:
        return "control: runner timeout"
    return None


def previous_seconds() -> dict[str, float]:
    try:
        document = json.loads(RESULTS.read_text(encoding="utf-8"))
        return {
            r["name"]: float(r["seconds"])
            for r in document.get("results", [])
            if r.get("status") in (KILLED, SURVIVED)
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def list_catalogue(breaks: Sequence[Break]) -> None:
    known = previous_seconds()
    for brk in breaks:
        seconds = known.get(brk.name, brk.estimate)
        flag = " [long]" if brk.long else ""
        print(f"{brk.name}{flag}  (~{minutes(seconds)})")
        print(f"    check: {brk.check}")
        print(f"    break: {brk.file}: {brk.original!r} -> {brk.replacement!r}")
        print(f"    must fail: {brk.target}")
    short = [b for b in breaks if not b.long]
    print(f"\n{len(breaks)} breaks ({len(breaks) - len(short)} long, run with LONG=1)")


@dataclass(frozen=True)
class _Group:
    """Breaks whose tests run in one control session (same pytest arguments and env)."""

    pytest_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def run_controls(
    breaks: Sequence[Break], commit: str, *, keep: bool
) -> tuple[dict[str, str | None], float]:
    """Each break's control problem (None: its tests pass unmutated), and the seconds spent."""
    problems: dict[str, str | None] = {}
    groups: dict[_Group, list[Break]] = {}
    commands = []
    for brk in breaks:
        if brk.command is not None:
            commands.append(brk)
        else:
            key = _Group(tuple(brk.pytest_args), tuple(sorted(brk.env.items())))
            groups.setdefault(key, []).append(brk)
    spent = 0.0
    with clone_of(commit, keep=keep) as clone:
        for i, (key, members) in enumerate(groups.items()):
            tests = list(dict.fromkeys(t for b in members for t in b.tests))
            print(f"control: {len(tests)} test ids of {len(members)} breaks, unmutated", flush=True)
            run = run_in(
                clone,
                None,
                tests=tests,
                command=None,
                pytest_args=key.pytest_args,
                extra_env=dict(key.env),
                stop_first=False,
                timeout=sum(b.timeout for b in members),
                log=LOGS / f"control-{i}.log",
            )
            spent += run.seconds
            print(
                f"control: exit {run.exit_code}, {run.cases.count('passed')} passed, "
                f"{run.cases.count('failed')} failed, {run.cases.count('error')} errors, "
                f"{run.cases.count('skipped')} skipped ({minutes(run.seconds)})",
                flush=True,
            )
            for brk in members:
                problems[brk.name] = control_problem(brk, run)
        for brk in commands:
            print(f"control: {brk.name}: {brk.command}", flush=True)
            run = run_in(
                clone,
                None,
                tests=(),
                command=brk.command,
                pytest_args=(),
                extra_env=dict(brk.env),
                stop_first=False,
                timeout=brk.timeout,
                log=LOGS / f"control-{brk.name}.log",
            )
            spent += run.seconds
            problems[brk.name] = control_problem(brk, run)
    return problems, spent


def result_of(brk: Break, status: str, seconds: float, detail: str, **extra: Any) -> Result:
    return Result(
        name=brk.name,
        check=brk.check,
        file=brk.file,
        line=extra.get("line"),
        original=brk.original,
        replacement=brk.replacement,
        target=brk.target,
        long=brk.long,
        status=status,
        seconds=round(seconds, 1),
        detail=detail,
        failed_tests=extra.get("failed_tests", []),
    )


def run_break(brk: Break, commit: str, *, keep: bool) -> Result:
    with clone_of(commit, keep=keep) as clone:
        try:
            line = apply(clone, brk)
        except CatalogueError as exc:
            return result_of(brk, ERROR, 0.0, f"catalogue rot: {exc}")
        changed = git("diff", "--numstat", cwd=clone).splitlines()
        if changed != [f"1\t1\t{brk.file}"]:
            return result_of(brk, ERROR, 0.0, f"the edit is not one line: {changed}")
        run = run_in(
            clone,
            brk,
            tests=brk.tests,
            command=brk.command,
            pytest_args=brk.pytest_args,
            extra_env={},
            stop_first=True,
            timeout=brk.timeout,
            log=LOGS / f"{brk.name}.log",
        )
        status, detail, failed = verdict(brk, run)
        return result_of(brk, status, run.seconds, detail, line=line, failed_tests=failed)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutants", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", default="", help="comma-separated break names (long ones too)")
    parser.add_argument("--long", action="store_true", help="also the breaks marked long")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")
    parser.add_argument("--commit", default="HEAD", help="the commit to clone (default HEAD)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clones")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/testing.md alone")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        breaks = load_catalogue(args.catalogue)
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        chosen = select(breaks, only, long=args.long)
    except CatalogueError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    if args.list:
        list_catalogue(breaks)
        return 0
    commit = git("rev-parse", "--verify", f"{args.commit}^{{commit}}")
    short = commit[:10]
    command = (
        "make mutants"
        + (f" ONLY={','.join(only)}" if only else "")
        + (" LONG=1" if args.long else "")
    )
    started, began = time.monotonic(), datetime.now(UTC)
    results: dict[str, Result] = {}
    # Catalogue rot first, against the commit under test: loud, before anything runs.
    runnable = []
    for brk in chosen:
        try:
            locate(git("show", f"{commit}:{brk.file}"), brk)
        except (CatalogueError, subprocess.CalledProcessError) as exc:
            detail = str(exc) if isinstance(exc, CatalogueError) else f"{brk.file} not in {short}"
            print(f"CATALOGUE ROT: {detail}", file=sys.stderr, flush=True)
            results[brk.name] = result_of(brk, ERROR, 0.0, f"catalogue rot: {detail}")
            continue
        missing = missing_tests(REPO, brk) if brk.tests else []
        if missing:
            detail = f"named tests missing: {', '.join(missing)}"
            print(f"CATALOGUE ROT: break {brk.name}: {detail}", file=sys.stderr, flush=True)
            results[brk.name] = result_of(brk, ERROR, 0.0, f"catalogue rot: {detail}")
            continue
        runnable.append(brk)
    known = previous_seconds()
    estimate = sum(known.get(b.name, b.estimate) for b in runnable) + 3 * len(runnable)
    print(
        f"mutants: {len(runnable)} breaks of {len(breaks)} on {short} (a clone of the commit; "
        f"uncommitted changes are not part of it), estimate ~{minutes(estimate)}"
        " with the control and the clones",
        flush=True,
    )
    if os.environ.get("RATIFIER_DEVELOPMENT_MODE") is None:
        os.environ["RATIFIER_DEVELOPMENT_MODE"] = "true"
    controls, control_seconds = (
        run_controls(runnable, commit, keep=args.keep) if runnable else ({}, 0.0)
    )
    for i, brk in enumerate(runnable, 1):
        label = f"[{i:2d}/{len(runnable)}] {brk.name}"
        problem = controls.get(brk.name)
        if problem is not None:
            results[brk.name] = result_of(brk, ERROR, 0.0, problem)
            print(f"{label}: error ({problem})", flush=True)
            continue
        print(f"{label} …", end=" ", flush=True)
        result = run_break(brk, commit, keep=args.keep)
        results[brk.name] = result
        print(f"{result.status} ({result.seconds:.0f} s; {result.detail})", flush=True)
        if result.status != KILLED:
            print(f"    log: {LOGS / (brk.name + '.log')}", flush=True)
    ordered = [results[b.name] for b in chosen if b.name in results]
    if not only:  # a whole run: the long breaks not run are listed as such
        ordered += [
            result_of(b, NOT_RUN, 0.0, "long: make mutants LONG=1")
            for b in breaks
            if b.name not in results
        ]
        ordered.sort(key=lambda r: [b.name for b in breaks].index(r.name))
    duration = time.monotonic() - started
    counts = {
        s: sum(1 for r in ordered if r.status == s) for s in (KILLED, SURVIVED, ERROR, NOT_RUN)
    }
    summary = (
        f"{counts[KILLED]} killed, {counts[SURVIVED]} survived, {counts[ERROR]} errors"
        + (f", {counts[NOT_RUN]} long not run" if counts[NOT_RUN] else "")
        + f" of {len(ordered)} breaks in {minutes(duration)} (control {minutes(control_seconds)})"
    )
    print(f"\nmutants on {short}: {summary}")
    for r in ordered:
        if r.status in (SURVIVED, ERROR):
            print(f"  {r.status.upper()}: {r.name}: {r.detail}\n    must fail: {r.target}")
    document = {
        "commit": commit,
        "date": began.isoformat(timespec="seconds"),
        "command": command,
        "catalogue": str(args.catalogue.resolve().relative_to(REPO))
        if args.catalogue.resolve().is_relative_to(REPO)
        else str(args.catalogue),
        "seconds": round(duration, 1),
        "control_seconds": round(control_seconds, 1),
        "summary": summary,
        "counts": counts,
        "results": [asdict(r) for r in ordered],
    }
    ARTIFACTS.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(REPO)}")
    if not only and not args.no_docs and args.catalogue == CATALOGUE:
        write_docs(REPO / "docs" / "testing.md", document)
        print("wrote the table in docs/testing.md")
    return 0 if counts[SURVIVED] == 0 and counts[ERROR] == 0 else 1
