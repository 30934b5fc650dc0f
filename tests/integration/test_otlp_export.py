"""The `otlp` exporter really speaks OTLP/HTTP: a loopback receiver decodes what it posts."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from telemetry.otel import otel_tracer
from telemetry.tracing import TraceParent
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.integration


class Collector:
    """A minimal OTLP/HTTP trace receiver on loopback, in its own thread and event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[ExportTraceServiceRequest] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _receive(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        self.requests.append(message)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._receive)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10), "collector did not start"

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


def test_otlp_exporter_posts_spans_in_the_records_trace(collector: Collector) -> None:
    tracer = otel_tracer(
        "otlp", endpoint=f"http://127.0.0.1:{collector.port}/v1/traces", service="executor"
    )
    trace_id, parent_span = f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"
    now = time.time_ns()
    span_id = tracer.record(
        stage="execute",
        trace_id=trace_id,
        parent=TraceParent(trace_id=trace_id, span_id=parent_span),
        start_ns=now,
        end_ns=now + 2_000_000,
        attributes={"ratifier.call_id": "c-otlp-1", "ratifier.status": "succeeded"},
    )
    tracer.shutdown()  # flushes the batch processor: the post happens before it returns

    spans = [
        (resource_spans.resource, span)
        for request in collector.requests
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    assert len(spans) == 1
    resource, span = spans[0]
    assert span.name == "execute"
    assert span.trace_id.hex() == trace_id
    assert span.span_id.hex() == span_id
    assert span.parent_span_id.hex() == parent_span
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["ratifier.call_id"] == "c-otlp-1"
    assert attributes["ratifier.status"] == "succeeded"
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "ratifier-executor"
