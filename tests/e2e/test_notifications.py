"""Approver notifications with the real pipeline: a refund that needs approval reaches the
tenant's webhook (signed, with its preview and a link to decide, no credential) through
`ratifier notifier` as a process; the approval then runs it (docs/notifications.md)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from approvals.notify import verify_signature
from schemas.names import DELIVERY_HEADER, SIGNATURE_HEADER
from tests.e2e.approvals_kit import decide, propose, terminal_outcomes, token, wait_for
from tests.e2e.conftest import Pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SECRET = "whsec-e2e-0123456789abcdef"


class Hooks:
    """What the receiver got: (delivery id, signature verified, body)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[tuple[str, bool, dict[str, Any]]] = []

    def of(self, call_id: str) -> list[tuple[str, bool, dict[str, Any]]]:
        with self.lock:
            return [r for r in self.received if r[2].get("call_id") == call_id]


@pytest.fixture
def receiver() -> Iterator[tuple[Hooks, str]]:
    hooks = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            signed = verify_signature(SECRET, self.headers.get(SIGNATURE_HEADER), raw, time.time())
            with hooks.lock:
                hooks.received.append(
                    (self.headers.get(DELIVERY_HEADER, ""), signed, json.loads(raw))
                )
            self.send_response(204 if signed else 401)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hooks, f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_refund_awaiting_approval_reaches_the_tenants_webhook_signed(
    pipeline: Pipeline, receiver: tuple[Hooks, str], tmp_path: Path
) -> None:
    hooks, url = receiver
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "tenants": {
                    "tenant-a": [
                        {
                            "name": "e2e-ops",
                            "url": url,
                            "secret_env": "E2E_WEBHOOK_SECRET",
                            "kinds": ["approver", "confirmation"],
                        }
                    ]
                }
            }
        )
    )
    notifier = pipeline.start(
        "notifier",
        "notifier",
        RATIFIER_NOTIFICATIONS__ENDPOINTS_FILE=str(endpoints),
        RATIFIER_NOTIFICATIONS__METRICS_PORT="0",
        RATIFIER_NOTIFICATIONS__DASHBOARD_URL="https://ratifier.example/",
        E2E_WEBHOOK_SECRET=SECRET,
    )
    try:
        (request,) = propose(pipeline)
        call_id = request["call_id"]
        wait_for(lambda: len(hooks.of(call_id)) >= 1, timeout=60)
        got = hooks.of(call_id)
        assert all(signed for _, signed, _ in got), got
        approver = next(body for _, _, body in got if body["kind"] == "approver")
        assert approver["tenant"] == "tenant-a" and approver["tool"] == "propose_refund"
        assert approver["preview"] == request["preview"]
        assert approver["required_approvals"] == request["required_approvals"]
        assert approver["decide_url"] == f"https://ratifier.example/?call={call_id}"
        raw = json.dumps([body for _, _, body in got])
        assert "eyJ" not in raw and SECRET not in raw and "arguments" not in raw
        # A refund names its payment's customer as the subject: asked to confirm as well.
        assert request["subject"], request
        wait_for(lambda: len(hooks.of(call_id)) >= 2, timeout=30)
        by_kind = {body["kind"]: body for _, _, body in hooks.of(call_id)}
        assert set(by_kind) == {"approver", "confirmation"}
        assert by_kind["confirmation"]["subject"] == request["subject"]
        assert len({delivery for delivery, _, _ in hooks.of(call_id)}) == len(hooks.of(call_id))

        # The human decides (as the link would let them); the call runs.
        decide(pipeline, request, token(pipeline.settings, "boss"))
        (outcome,) = terminal_outcomes(pipeline, {call_id})[call_id]
        assert outcome["status"] == "succeeded", outcome
    finally:
        pipeline.stop_worker("notifier")
    assert notifier.process.returncode == 0, notifier.log_tail()
