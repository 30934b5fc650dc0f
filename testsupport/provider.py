"""A fake payment provider: a small HTTP service with idempotent refunds and switchable faults.

It stands in for a real provider in tests and the demo. State is in memory. ``POST /refunds``
applies a refund at most once per ``Idempotency-Key``: a replay with the same body returns the
first response, a replay with another body is refused (409). ``GET /refunds?idempotency_key=K``
is the reconciliation lookup. ``/_faults`` switches failures on (latency, 503 before the effect,
a dropped connection after the effect, fully down); ``/_stats`` counts applied effects, so tests
can assert that provider effects equal unique operations.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from runtime.signals import stop_event

MAX_KEY_LENGTH = 200


class RefundRequest(BaseModel):
    """The body of ``POST /refunds``; strict, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenant: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    payment_id: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    amount_minor: Annotated[int, Field(gt=0, le=10**12)]
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{3}$")]


class FaultSettings(BaseModel):
    """The body of ``POST /_faults``: every field optional, merged into the current faults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    latency_ms: Annotated[int, Field(ge=0, le=600_000)] | None = None
    fail_before: Annotated[int, Field(ge=0)] | None = None
    drop_after: Annotated[int, Field(ge=0)] | None = None
    down: bool | None = None
    then_down: bool | None = None


@dataclass
class Faults:
    latency_ms: int = 0
    fail_before: int = 0  # the next N POSTs answer 503 without applying
    drop_after: int = 0  # the next N POSTs apply, then drop the connection unanswered
    down: bool = False  # every /refunds request has its connection closed at once
    # With drop_after: the provider goes down as it drops an answer, so no check can reach
    # it before a test says so (a reconciler is faster than the test's next request).
    then_down: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "fail_before": self.fail_before,
            "drop_after": self.drop_after,
            "down": self.down,
            "then_down": self.then_down,
        }


@dataclass
class _Applied:
    request: RefundRequest
    refund: dict[str, Any]


@dataclass
class ProviderState:
    refunds: dict[str, _Applied] = field(default_factory=dict)  # by idempotency key
    applied_by_key: dict[str, int] = field(default_factory=dict)
    posts: int = 0
    faults: Faults = field(default_factory=Faults)
    # Check-and-apply runs under this lock, so concurrent POSTs with one key apply once.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def reset(self) -> None:
        self.refunds.clear()
        self.applied_by_key.clear()
        self.posts = 0
        self.faults = Faults()


STATE = web.AppKey("provider_state", ProviderState)


def _error(status: int, error: str, **extra: Any) -> web.Response:
    return web.json_response({"error": error, **extra}, status=status)


def _drop(request: web.Request) -> web.Response:
    """Close the connection without an answer; the client sees a disconnect."""
    if request.transport is not None:
        request.transport.abort()
    # Nothing can be written any more; aiohttp discards this response on the closed transport.
    return web.Response(status=204)


async def _pause(state: ProviderState) -> None:
    if state.faults.latency_ms > 0:
        await asyncio.sleep(state.faults.latency_ms / 1000)


async def create_refund(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.posts += 1
    if state.faults.down:
        return _drop(request)
    try:
        raw = await request.read()  # the whole request arrives; then the provider is slow
    except ConnectionError:
        return _drop(request)  # the client went away mid-request: nothing applied
    await _pause(state)
    if state.faults.fail_before > 0:
        state.faults.fail_before -= 1
        return _error(503, "unavailable", applied=False)
    key = request.headers.get("Idempotency-Key", "")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        return _error(400, "invalid_idempotency_key")
    try:
        body = RefundRequest.model_validate_json(raw)
    except ValidationError:
        return _error(422, "invalid_body")
    async with state.lock:
        first = state.refunds.get(key)
        if first is not None and first.request != body:
            return _error(409, "idempotency_key_reused")
        status = 200
        if first is None:
            refund = {
                "id": f"prv_{secrets.token_hex(12)}",
                "status": "succeeded",
                "idempotency_key": key,
                "tenant": body.tenant,
                "payment_id": body.payment_id,
                "amount_minor": body.amount_minor,
                "currency": body.currency,
                "created_at": datetime.now(UTC).isoformat(),
            }
            first = state.refunds[key] = _Applied(request=body, refund=refund)
            state.applied_by_key[key] = state.applied_by_key.get(key, 0) + 1
            status = 201
        if state.faults.drop_after > 0:
            # The effect exists (just applied, or applied before); the answer is lost.
            state.faults.drop_after -= 1
            state.faults.down = state.faults.down or state.faults.then_down
            return _drop(request)
    return web.json_response(first.refund, status=status)


async def find_refund(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.faults.down:
        return _drop(request)
    await _pause(state)
    key = request.query.get("idempotency_key", "")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        return _error(400, "invalid_idempotency_key")
    found = state.refunds.get(key)
    if found is None:
        return _error(404, "not_found")
    return web.json_response(found.refund)


async def get_faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].faults.as_json())


async def set_faults(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        update = FaultSettings.model_validate_json(await request.read())
    except ValidationError:
        return _error(422, "invalid_body")
    for name, value in update.model_dump(exclude_none=True).items():
        setattr(state.faults, name, value)
    return web.json_response(state.faults.as_json())


async def clear_faults(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.faults = Faults()
    return web.json_response(state.faults.as_json())


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(
        {
            "refunds": sum(state.applied_by_key.values()),
            "by_key": dict(state.applied_by_key),
            # When each effect was applied (kill-switch tests: none after a freeze).
            "applied_at": {k: a.refund["created_at"] for k, a in state.refunds.items()},
            "posts": state.posts,
        }
    )


async def reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return web.json_response({"reset": True})


def build_app() -> web.Application:
    app = web.Application()
    app[STATE] = ProviderState()
    app.router.add_post("/refunds", create_refund)
    app.router.add_get("/refunds", find_refund)
    app.router.add_get("/_faults", get_faults)
    app.router.add_post("/_faults", set_faults)
    app.router.add_delete("/_faults", clear_faults)
    app.router.add_get("/_stats", stats)
    app.router.add_post("/_reset", reset)
    return app


async def serve(host: str, port: int, app: web.Application | None = None) -> web.AppRunner:
    """Start the provider on ``host:port`` (0: a free port); the caller cleans the runner up."""
    runner = web.AppRunner(app or build_app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the runner's first site listens on (useful after ``serve(host, 0)``)."""
    port: int = runner.addresses[0][1]
    return port


async def _run(host: str, port: int) -> None:
    stop = stop_event()
    runner = await serve(host, port)
    try:
        print(f"provider listening on http://{host}:{bound_port(runner)}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def run_provider(host: str, port: int) -> None:
    """Run the provider until SIGTERM or SIGINT, then shut it down gracefully."""
    asyncio.run(_run(host, port))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m testsupport.provider [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(
        prog="python -m testsupport.provider",
        description="the fake payment provider (in memory; for tests, the demo, benchmarks)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    run_provider(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "FaultSettings",
    "RefundRequest",
    "bound_port",
    "build_app",
    "run_provider",
    "serve",
]
