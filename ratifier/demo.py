"""`ratifier demo`: run the whole pipeline on a short scenario, print outcomes as they arrive,
and leave the pipeline and its dashboard running for a look around."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from approvals.signing import approval_keys, sign_decision, statement_for
from config.settings import DEVELOPMENT_MODE_ENV, Settings
from ratifier.migrate import migrate
from ratifier.processes import (
    FAKE_PROVIDER_MODULE,
    WorkerProcess,
    start_worker_args,
    wait_for_log,
)
from ratifier.topics import ensure_topics
from ratifier_client.client import RatifierClient
from runtime.clients import database_conninfo, kafka_consumer, kafka_producer
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import Actor, ApprovalVerdict, Outcome
from schemas.lanes import proposal_key
from schemas.names import Topic


def _log_dir(settings: Settings) -> Path:
    return settings.local_home / "logs"


def _run_dir(settings: Settings) -> Path:
    """`deploy/local/down` stops every process recorded here (demo-*.pid) before the
    services."""
    return settings.local_home / "run"


# name -> `ratifier` arguments and the log line that says it is ready (the dashboard is
# checked over HTTP). The order is the start order.
DEMO_PROCESSES: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("provider", (), None),
    ("streams", ("streams",), "approval-join ready"),
    ("executor", ("executor",), " started on "),
    ("reconciler", ("reconciler",), None),
    ("audit-sink", ("audit", "sink"), "audit sink started"),
    ("dashboard", ("dashboard",), None),
    ("mcp", ("mcp",), "mcp gateway listening"),
)

AWAITING = "awaiting_approval"


@dataclass(frozen=True, kw_only=True)
class Step:
    title: str
    tool: str
    arguments: dict[str, Any]
    tenant: str
    expect_status: str
    expect_code: str | None
    roles: tuple[str, ...] = ("support",)
    # None: no approval involved; True: the demo's approver approves; False: left pending.
    approve: bool | None = None


SCENARIO = (
    Step(
        title="own payment",
        tool="get_payment",
        arguments={"payment_id": "pay_A1001"},
        tenant="tenant-a",
        expect_status="succeeded",
        expect_code=None,
    ),
    Step(
        title="other tenant's payment",
        tool="get_payment",
        arguments={"payment_id": "pay_B2001"},
        tenant="tenant-a",
        expect_status="denied",
        expect_code="not_found",
    ),
    Step(
        title="bogus tool",
        tool="refund_everything",
        arguments={},
        tenant="tenant-a",
        expect_status="rejected",
        expect_code="unknown_tool",
    ),
    Step(
        title="injected tenant_id",
        tool="get_payment",
        arguments={"payment_id": "pay_B2001", "tenant_id": "tenant-b"},
        tenant="tenant-a",
        expect_status="rejected",
        expect_code="invalid_arguments",
    ),
    Step(
        title="destructive tool",
        tool="delete_payment_method",
        arguments={"payment_method_id": "pm_A1"},
        tenant="tenant-a",
        expect_status="denied",
        expect_code="policy_denied",
    ),
    Step(
        title="refund, human-approved",
        tool="propose_refund",
        arguments={"payment_id": "pay_A1002", "amount_minor": 5, "reason": "late delivery"},
        tenant="tenant-a",
        roles=("refund",),
        expect_status="succeeded",
        expect_code=None,
        approve=True,
    ),
    Step(
        title="refund, left for you",
        tool="propose_refund",
        arguments={"payment_id": "pay_A1002", "amount_minor": 5, "reason": "damaged item"},
        tenant="tenant-a",
        roles=("refund",),
        expect_status=AWAITING,
        expect_code="approval_required",
        approve=False,
    ),
)

DEMO_AGENT = "agent-7"
DEMO_APPROVER = "demo-approver"

COLUMNS = ("call", "scenario", "tool", "status", "code", "detail", "ok")
WIDTHS = (22, 24, 22, 17, 18, 34, 3)


def _row(values: tuple[str, ...]) -> str:
    return "  ".join(v[:w].ljust(w) for v, w in zip(values, WIDTHS, strict=True))


def _detail(outcome: Outcome) -> str:
    """The table's detail column: who let the call run, its result, or why it stopped."""
    receipt = outcome.approval
    if receipt is not None:
        # Staff approval and the customer's confirmation are different paths
        # (docs/approvals.md): say which one the receipt records.
        if receipt.basis == "confirmation":
            return f"confirmed by {receipt.approver} (the customer)"
        if receipt.basis == "auto":
            return f"approved by policy {receipt.auto_policy or receipt.approver}"
        return f"approved by {receipt.approver}"
    if outcome.result:
        return json.dumps(outcome.result, separators=(",", ":"))
    if outcome.error and outcome.error.fields:
        return "; ".join(f"{f.path}: {f.problem}" for f in outcome.error.fields)
    if outcome.status.value == AWAITING:
        return "waiting in the approval inbox"
    return outcome.error.message if outcome.error else ""


async def _agent_paths(settings: Settings) -> list[tuple[str, ...]]:
    """The read an agent makes, once through the client library and once through the MCP
    gateway: one table row each (the same columns as the scenario's)."""
    from mcp.client import Client  # noqa: PLC0415 - the demo's MCP client only
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415

    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per MCP request
    token = issue_context_token(
        context_keys(settings), sub=DEMO_AGENT, tenant="tenant-a", roles=("support",)
    )
    arguments = {"payment_id": "pay_A1001"}
    rows: list[tuple[str, ...]] = []
    async with RatifierClient.from_settings(settings) as client:
        handle = await client.submit("get_payment", arguments, context=token)
        answer = await handle.result(within=60)
    if isinstance(answer, Outcome):
        ok = answer.status.value == "succeeded"
        rows.append(
            (handle.call_id, "own payment, via client", "get_payment", answer.status.value,
             "-", _detail(answer), "yes" if ok else "NO")
        )  # fmt: skip
    else:
        rows.append((handle.call_id, "own payment, via client", "get_payment", "pending",
                     "-", "no outcome in time", "NO"))  # fmt: skip
    url = f"http://127.0.0.1:{settings.mcp_port}/mcp"
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http)) as mcp,
    ):
        result = await mcp.call_tool("get_payment", arguments)
    body = dict(result.structured_content or {})
    status = str(body.get("status", "?"))
    ok = status == "succeeded" and not result.is_error
    rows.append(
        (str(body.get("call_id", "-")), "own payment, via MCP", "get_payment", status, "-",
         json.dumps(body.get("result"), separators=(",", ":")), "yes" if ok else "NO")
    )  # fmt: skip
    return rows


def _proposal(call_id: str, step: Step, token: str) -> bytes:
    envelope = {
        "v": 1,
        "call_id": call_id,
        "tool": step.tool,
        "arguments": step.arguments,
        "context": token,
        "proposed_at": datetime.now(UTC).isoformat(),
    }
    return json.dumps(envelope).encode()


async def _run_scenario(
    settings: Settings, run_id: str, wait_seconds: float
) -> tuple[bool, dict[str, tuple[Step, str]]]:
    """Publish the scenario, approve what the demo approves, and print each outcome.
    Returns whether every outcome was as expected, and call id -> (step, status seen)."""
    keys = context_keys(settings)
    consumer = kafka_consumer(
        settings,
        settings.topic(Topic.OUTCOMES),
        settings.topic(Topic.APPROVALS_REQUESTED),
        group=None,
        auto_offset_reset="latest",
    )
    producer = kafka_producer(settings)
    await consumer.start()
    await producer.start()
    try:
        # Resolve every partition's end before publishing, so that no outcome is missed.
        for tp in consumer.assignment():
            await consumer.position(tp)
        expected: dict[str, Step] = {}
        for number, step in enumerate(SCENARIO, start=1):
            call_id = f"demo-{run_id}-{number}"
            expected[call_id] = step
            token = issue_context_token(keys, sub=DEMO_AGENT, tenant=step.tenant, roles=step.roles)
            await producer.send_and_wait(
                settings.topic(Topic.PROPOSED),
                key=proposal_key(token, call_id=call_id).encode(),  # the tenant's lane (v1.6)
                value=_proposal(call_id, step, token),
            )
        print(
            f"published {len(expected)} calls; waiting for outcomes "
            f"(the first run waits for the workers to join their groups)…",
            flush=True,
        )
        print(_row(COLUMNS))
        print(_row(tuple("-" * w for w in WIDTHS)))
        seen: dict[str, tuple[Step, str]] = {}
        verdicts: dict[str, bool] = {}
        approvals_topic = settings.topic(Topic.APPROVALS_REQUESTED)
        deadline = time.monotonic() + wait_seconds
        while len(verdicts) < len(expected) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    body = json.loads(record.value or b"{}")
                    step_or_none = expected.get(str(body.get("call_id")))
                    if step_or_none is None:
                        continue
                    if tp.topic == approvals_topic:
                        if step_or_none.approve:
                            await _approve(settings, producer, body)
                        continue
                    outcome = Outcome.model_validate(body)
                    if outcome.call_id in verdicts:
                        continue  # a redelivered stage repeats its outcome; one row is enough
                    waiting = outcome.status.value == AWAITING
                    if not outcome.terminal and not (waiting and step_or_none.approve is False):
                        continue
                    code = outcome.error.code.value if outcome.error else ""
                    ok = (
                        outcome.status.value == step_or_none.expect_status
                        and (code or None) == step_or_none.expect_code
                    )
                    verdicts[outcome.call_id] = ok
                    seen[outcome.call_id] = (step_or_none, outcome.status.value)
                    print(
                        _row(
                            (
                                outcome.call_id,
                                step_or_none.title,
                                outcome.tool or "-",
                                outcome.status.value,
                                code or "-",
                                _detail(outcome),
                                "yes" if ok else "NO",
                            )
                        ),
                        flush=True,
                    )
        agent_rows = await _agent_paths(settings)
        for row in agent_rows:
            print(_row(row), flush=True)
        agents_ok = all(row[-1] == "yes" for row in agent_rows)
        missing = [c for c in expected if c not in verdicts]
        for call_id in missing:
            print(
                f"no outcome within {wait_seconds:.0f}s for {call_id} ({expected[call_id].title})"
            )
        return not missing and all(verdicts.values()) and agents_ok, seen
    finally:
        await consumer.stop()
        await producer.stop()


async def _approve(settings: Settings, producer: AIOKafkaProducer, request: dict[str, Any]) -> None:
    """Approve as the approval service does for an authenticated human: a decision bound to
    the request's call, tenant and fingerprint, signed with the service's key."""
    keys = approval_keys(settings)
    statement = statement_for(
        call_id=str(request["call_id"]),
        tenant=str(request["tenant"]),
        fingerprint=str(request["fingerprint"]),
        approver=Actor(sub=DEMO_APPROVER, tenant="tenant-a", roles=("approver",)),
        verdict=ApprovalVerdict.APPROVE,
        now=datetime.now(UTC),
        validity=keys.decision_validity,
        reason="demo approver",
    )
    decision = sign_decision(statement, keys)
    await producer.send_and_wait(
        settings.topic(Topic.APPROVALS_DECIDED),
        key=decision.call_id.encode(),
        value=decision.to_bytes(),
    )


def _stop_previous_demo(settings: Settings) -> None:
    """A new demo replaces the processes a previous one left running."""
    for pid_file in sorted(_run_dir(settings).glob("demo-*.pid")):
        try:
            pid = int(pid_file.read_text(encoding="utf-8").split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            pid_file.unlink(missing_ok=True)
            continue
        if b"ratifier.cli" in cmdline or FAKE_PROVIDER_MODULE.encode() in cmdline:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)


def worker_env(settings: Settings) -> dict[str, str]:
    """What the demo's workers get besides its own environment: its development mode (the
    built-in keys of a local scenario; `ratifier demo` always runs in it)."""
    return {DEVELOPMENT_MODE_ENV: "true"} if settings.development_mode else {}


def _start_processes(settings: Settings) -> list[WorkerProcess]:
    run_dir, log_dir = _run_dir(settings), _log_dir(settings)
    run_dir.mkdir(parents=True, exist_ok=True)
    workers = []
    env = worker_env(settings)
    for name, args, _ready in DEMO_PROCESSES:
        # The fake provider is test support: its own module, started, never imported.
        module = FAKE_PROVIDER_MODULE if name == "provider" else "ratifier.cli"
        worker = start_worker_args(
            list(args), name=f"demo-{name}", log_dir=log_dir, module=module, env=env
        )
        (run_dir / f"demo-{name}.pid").write_text(f"{worker.process.pid}\n", encoding="utf-8")
        workers.append(worker)
    return workers


def _wait_until_ready(url: str, workers: list[WorkerProcess], timeout: float) -> bool:
    """Every worker has said it is ready and the dashboard answers. Publishing earlier works
    too, but a worker still joining its group may process a record twice (at-least-once)."""
    deadline = time.monotonic() + timeout
    for (name, _args, needle), worker in zip(DEMO_PROCESSES, workers, strict=True):
        if needle and not wait_for_log(worker, needle, max(deadline - time.monotonic(), 0.1)):
            print(f"{name} did not become ready; last log lines:\n{worker.log_tail()}")
            return False
    while time.monotonic() < deadline:
        if any(w.process.poll() is not None for w in workers):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def _summary(settings: Settings, seen: dict[str, tuple[Step, str]], url: str) -> None:
    counts = Counter(status for _step, status in seen.values())
    waiting = [c for c, (_step, status) in seen.items() if status == AWAITING]
    approved = [c for c, (step, status) in seen.items() if step.approve and status == "succeeded"]
    denied = [c for c, (step, _s) in seen.items() if step.expect_code == "not_found"]
    # Commands to copy into another shell: the demo's keys are development mode's.
    ratifier = (
        f"{DEVELOPMENT_MODE_ENV}=true {settings.bin}" if settings.development_mode else settings.bin
    )
    print()
    print("summary")
    print(f"  calls:      {len(seen)} — " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    print(f"  dashboard:  {url}")
    print(
        "  sign in:    paste an approver token from "
        f"`{ratifier} token --tenant tenant-a --sub you --role approver`"
    )
    for call_id in waiting:
        print(
            f"  inbox:      {call_id} (a refund) waits for your decision in the dashboard "
            f"(it expires after {settings.approvals.ttl_seconds // 60} min)"
        )
    for call_id in approved + denied:
        print(f"  story:      {ratifier} audit show {call_id}")
    print(
        f"  running:    {', '.join(n for n, _a, _r in DEMO_PROCESSES)} on prefix "
        f"'{settings.topic_prefix}' (logs in {_log_dir(settings)}); `make down` stops them and "
        "the services"
    )


def run_demo(settings: Settings, *, timeout: float = 120.0) -> int:
    migrate(database_conninfo(settings))
    asyncio.run(ensure_topics(settings))
    _stop_previous_demo(settings)
    run_id = f"{datetime.now(UTC):%H%M%S}-{uuid.uuid4().hex[:4]}"
    url = f"http://127.0.0.1:{settings.dashboard_port}/"
    workers = _start_processes(settings)
    started = ", ".join(f"{w.name.removeprefix('demo-')} (pid {w.process.pid})" for w in workers)
    print(f"started {started}; logs in {_log_dir(settings)}", flush=True)
    ok = False
    try:
        if not _wait_until_ready(url, workers, timeout=90):
            print(f"the pipeline or its dashboard ({url}) did not become ready")
        else:
            ok, seen = asyncio.run(_run_scenario(settings, run_id, timeout))
            if ok:
                _summary(settings, seen, url)
    finally:
        if not ok:
            for worker in workers:
                code = worker.stop()
                if code not in (0, -15):
                    print(f"{worker.name} exited with {code}; last log lines:\n{worker.log_tail()}")
            _stop_previous_demo(settings)
            print("stopped the demo's processes")
    print("demo: every outcome as expected" if ok else "demo: FAILED (see above)")
    return 0 if ok else 1
