"""Prometheus metrics of every ratifier service, and the `/metrics` endpoint that serves them.

All metrics live in the process-wide default registry and are named ``ratifier_*``. Labels
are low-cardinality only (stage, status, code, dedup layer and result, consumer group,
topic, partition); never a call id, tenant or operation id.

Serving them:

- a service with its own aiohttp app adds the route::

      app.router.add_get("/metrics", metrics_handler)

- a service without one starts a small server (``port`` 0: none) and closes it on exit::

      close = await serve_metrics("127.0.0.1", 9102)
      ...
      await close()

Recording them (helpers below keep the per-record cost to a few dict lookups):

    observe_record("execute", status="succeeded", code=None, seconds=0.012)
    count_dedup("redis", "hit")
    await refresh_consumer_lag(consumer, group)        # aiokafka consumer, periodically
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    # aiohttp loads where a server is built: a command that only counts (the operator's
    # `ratifier budgets`, `limits`, `ops`) does not import an HTTP server.
    from aiohttp import web

log = logging.getLogger("ratifier.metrics")

RECORDS = Counter(
    "ratifier_records",
    "Records a stage finished, by stage and the status it gave them (an outcome status, or "
    "forwarded / committed / deadletter / ignored).",
    ["stage", "status"],
)
ERRORS = Counter(
    "ratifier_errors",
    "Outcomes carrying an error, by stage and error code.",
    ["stage", "code"],
)
STAGE_SECONDS = Histogram(
    "ratifier_stage_seconds",
    "Time a record spent in a stage (for batched stages: its batch).",
    ["stage"],
    buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0),
)
CONSUMER_LAG = Gauge(
    "ratifier_consumer_lag",
    "Records behind the high watermark, per consumer group and partition.",
    ["group", "topic", "partition"],
)
DEDUP = Counter(
    "ratifier_dedup",
    "Executor dedup decisions: layer redis (claimed, done = hit, conflict, busy, expired, "
    "unavailable) or ledger (claimed, replay = hit, conflict, in_flight).",
    ["layer", "result"],
)
POLICY_EVALUATION_ERRORS = Counter(
    "ratifier_policy_evaluation_errors",
    "Calls denied because a Cedar policy could not be evaluated, by the policy's @id.",
    ["policy"],
)
RECONCILIATIONS = Counter(
    "ratifier_reconciliations",
    "Reconciliation checks, by result (settled, rescheduled, escalated).",
    ["result"],
)
RECONCILIATION_QUEUE = Gauge(
    "ratifier_reconciliation_queue_size",
    "Operations whose outcome is unknown and not yet settled (escalated ones included).",
)
RECONCILIATION_ESCALATED = Gauge(
    "ratifier_reconciliation_escalated",
    "Unknown operations escalated to humans, waiting for `ratifier ops resolve`.",
)
RECONCILIATION_OLDEST_AGE = Gauge(
    "ratifier_reconciliation_oldest_age_seconds",
    "Age of the oldest unsettled unknown operation (0 when there is none).",
)
NOTIFICATIONS = Counter(
    "ratifier_notifications",
    "Approval notifications (webhooks), by result: queued, no_endpoint, delivered, retried, "
    "dead, dead_letter_published.",
    ["result"],
)
NOTIFICATIONS_PENDING = Gauge(
    "ratifier_notifications_pending",
    "Webhook deliveries still owed (queued or waiting for a retry), all tenants.",
)
BREAKER_STATE = Gauge(
    "ratifier_breaker_state",
    "A downstream's circuit breaker as this executor last saw it (shared through Redis): "
    "0 closed, 1 half-open, 2 open; per breaker (`<downstream>:<read|write>`).",
    ["breaker"],
)
BREAKER_REFUSALS = Counter(
    "ratifier_breaker_refusals",
    "Calls ended `unavailable` before any effect because their breaker was open, per breaker.",
    ["breaker"],
)

# Every metric family this module exports, by exposed sample-name prefix (the dashboard test
# checks its expressions against these).
METRIC_NAMES: frozenset[str] = frozenset(
    {
        "ratifier_records_total",
        "ratifier_errors_total",
        "ratifier_stage_seconds_bucket",
        "ratifier_stage_seconds_sum",
        "ratifier_stage_seconds_count",
        "ratifier_consumer_lag",
        "ratifier_dedup_total",
        "ratifier_reconciliations_total",
        "ratifier_reconciliation_queue_size",
        "ratifier_reconciliation_escalated",
        "ratifier_reconciliation_oldest_age_seconds",
        "ratifier_notifications_total",
        "ratifier_notifications_pending",
        "ratifier_breaker_state",
        "ratifier_breaker_refusals_total",
    }
)

# Label children cached per label values: `labels()` takes a lock and builds a tuple.
_records: dict[tuple[str, str], Any] = {}
_errors: dict[tuple[str, str], Any] = {}
_seconds: dict[str, Any] = {}
_dedup: dict[tuple[str, str], Any] = {}


def observe_record(stage: str, *, status: str, code: str | None, seconds: float) -> None:
    """One record finished ``stage`` with ``status`` (and error ``code``) in ``seconds``."""
    observe_records(stage, status=status, code=code, seconds=seconds, n=1)


def observe_records(stage: str, *, status: str, code: str | None, seconds: float, n: int) -> None:
    """``n`` records finished ``stage`` with ``status`` (and error ``code``), each in
    ``seconds`` (a batch's records: one count of ``n``, ``n`` observations)."""
    if n <= 0:
        return
    key = (stage, status)
    counter = _records.get(key)
    if counter is None:
        counter = _records[key] = RECORDS.labels(stage, status)
    counter.inc(n)
    if code is not None:
        key = (stage, code)
        errors = _errors.get(key)
        if errors is None:
            errors = _errors[key] = ERRORS.labels(stage, code)
        errors.inc(n)
    histogram = _seconds.get(stage)
    if histogram is None:
        histogram = _seconds[stage] = STAGE_SECONDS.labels(stage)
    _observe_times(histogram, seconds, n)


def _observe_times(histogram: Any, seconds: float, n: int) -> None:
    """``n`` observations of ``seconds``: what ``n`` calls of ``observe`` record (the sum and
    one bucket), in one step (a flood's batch of thousands of refusals is counted at once)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if n == 1 or bounds is None or buckets is None or total is None:
        for _ in range(n):
            histogram.observe(seconds)
        return
    total.inc(seconds * n)
    for i, bound in enumerate(bounds):
        if seconds <= bound:
            buckets[i].inc(n)
            break


def count_records(stage: str, status: str, n: int = 1) -> None:
    """``n`` records finished ``stage`` with ``status`` (no latency: e.g. the audit sink)."""
    if n <= 0:
        return
    key = (stage, status)
    counter = _records.get(key)
    if counter is None:
        counter = _records[key] = RECORDS.labels(stage, status)
    counter.inc(n)


def count_dedup(layer: str, result: str) -> None:
    key = (layer, result)
    counter = _dedup.get(key)
    if counter is None:
        counter = _dedup[key] = DEDUP.labels(layer, result)
    counter.inc()


def count_policy_evaluation_error(policy: str) -> None:
    POLICY_EVALUATION_ERRORS.labels(policy[:128]).inc()


def count_notification(result: str, n: int = 1) -> None:
    NOTIFICATIONS.labels(result).inc(n)


def set_notifications_pending(n: int) -> None:
    NOTIFICATIONS_PENDING.set(n)


def set_breaker_state(breaker: str, level: int) -> None:
    """``breaker``'s state as just seen: 0 closed, 1 half-open, 2 open."""
    BREAKER_STATE.labels(breaker[:80]).set(level)


def count_breaker_refusal(breaker: str) -> None:
    BREAKER_REFUSALS.labels(breaker[:80]).inc()


def set_lag(group: str, topic: str, partition: int, lag: int) -> None:
    CONSUMER_LAG.labels(group, topic, str(partition)).set(max(lag, 0))


async def refresh_consumer_lag(consumer: Any, group: str) -> None:
    """Lag of a consumer's assigned partitions (an aiokafka consumer): the high
    watermark as of its last fetch minus its position. A consumer that is not started or
    loses a partition mid-refresh is skipped: lag is refreshed again shortly."""
    try:
        assigned = consumer.assignment()
    except Exception as exc:  # noqa: BLE001 - not started yet, or stopping
        log.debug("consumer lag unavailable: %s", exc)
        return
    for tp in assigned:
        try:
            highwater = consumer.highwater(tp)
            position = await consumer.position(tp)
        except Exception as exc:  # noqa: BLE001 - a partition moved away mid-refresh
            log.debug("lag of %s unavailable: %s", tp, exc)
            continue
        if highwater is not None and position is not None:
            set_lag(group, tp.topic, tp.partition, highwater - position)


def set_reconciliation_queue(*, size: int, escalated: int, oldest_age_seconds: float) -> None:
    RECONCILIATION_QUEUE.set(size)
    RECONCILIATION_ESCALATED.set(escalated)
    RECONCILIATION_OLDEST_AGE.set(oldest_age_seconds)


def metrics_body() -> tuple[bytes, str]:
    """The exposition text of the default registry and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST


async def metrics_handler(_request: web.Request) -> web.Response:
    from aiohttp import web  # noqa: PLC0415 - see the TYPE_CHECKING import above

    body, content_type = metrics_body()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


async def serve_metrics(
    host: str,
    port: int,
    *,
    more_routes: Callable[[web.Application], None] | None = None,
    what: str = "metrics",
) -> Callable[[], Awaitable[None]]:
    """Serve ``GET /metrics`` (and whatever ``more_routes`` adds, e.g. health) on
    ``host:port`` (0: serve nothing); return the closer. A port already in use is logged, not
    fatal: metrics never stop a service."""
    if port == 0:
        return _nothing_to_close
    from aiohttp import web  # noqa: PLC0415 - see the TYPE_CHECKING import above

    app = web.Application()
    if more_routes is not None:
        more_routes(app)
    app.router.add_get("/metrics", metrics_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        log.error("%s: cannot listen on %s:%d (%s); serving none", what, host, port, exc)
        await runner.cleanup()
        return _nothing_to_close
    log.info("%s on http://%s:%d/ (%s)", what, host, port, ", ".join(sorted(_paths(app))))
    return runner.cleanup


def _paths(app: web.Application) -> set[str]:
    return {r.resource.canonical.lstrip("/") for r in app.router.routes() if r.resource}


async def _nothing_to_close() -> None:
    return None
