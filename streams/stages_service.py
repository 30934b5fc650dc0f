"""`ratifier stages`: the stateless stages (validator, authorizer) on the runtime's consumer
loop, in a process of their own, with the approval HTTP API and the health pages
on the runtime's one HTTP server (runtime/shell.py). The approval-join runs in
`ratifier approval-join` (streams/join_service.py).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial

from aiokafka.errors import KafkaError

from approvals.http import approval_routes
from approvals.inbox import ApprovalInbox
from approvals.signing import approval_keys
from commands.catalog import Catalog
from commands.validate import Limits
from config.settings import Settings
from feeds.freezes import FleetFreezes
from feeds.policies import PolicyFeed
from runtime.clients import database_conninfo
from runtime.health import Health
from runtime.identity import context_keys
from runtime.retry import retrying
from runtime.shell import ServiceShell, StartupHook
from runtime.supervision import SideTask
from schemas.errors import ConfigurationError
from schemas.vocabulary import StreamStage
from streams.approval import Rules
from streams.budget_view import BudgetView
from streams.observe import StageObserver
from streams.stateless import StatelessStages
from streams.storage import StreamStorage
from telemetry.tracing import tracer_from

STAGES = frozenset(StreamStage)
STATELESS = frozenset({StreamStage.VALIDATOR, StreamStage.AUTHORIZER})


def limits_from(settings: Settings) -> Limits:
    return Limits(
        max_record_bytes=settings.limits.max_record_bytes,
        max_nesting_depth=settings.limits.max_nesting_depth,
        max_string_length=settings.limits.max_string_length,
        reply_namespace=settings.reply_namespace,
    )


def known_stages(settings: Settings) -> frozenset[StreamStage]:
    unknown = settings.streams.stages - STAGES
    if unknown:
        raise ConfigurationError(
            f"unknown stream stages {sorted(unknown)}; known: {sorted(STAGES)}"
        )
    return settings.streams.stages


def stages_shell(
    settings: Settings,
    *,
    catalog: Catalog,
    feed: PolicyFeed,
    prepare: StartupHook | None = None,
) -> tuple[ServiceShell, StatelessStages, asyncio.Event]:
    """The shell of `ratifier stages`, wired (tests run it in-process); the stages' stop
    event, set once the kill-switch view is caught up."""
    stages = known_stages(settings) & STATELESS
    keys = context_keys(settings)
    storage = StreamStorage(database_conninfo(settings))
    observer = StageObserver(tracer_from(settings, service="streams"))
    health = Health.of("stages", settings)
    # The kill switch (commands/freezes.py): the stages admit calls once the view is caught up.
    freezes = FleetFreezes(settings)
    freezes_ready = asyncio.Event()
    stateless = StatelessStages(
        settings,
        stages=stages,
        catalog=catalog,
        feed=feed,
        keys=keys,
        limits=limits_from(settings),
        fetch_many=storage.fetch_many,
        tracer=observer.tracer,
        freezes=freezes,
        operations=storage.operations_seen,
        budgets=BudgetView(storage.budget_windows).with_budgets,
        health=health,
        # `@approval("auto")` calls are committed by the authorizer with the approval
        # service's signed receipt (this process signs decisions already: approvals/http.py).
        receipts=Rules(
            keys=approval_keys(settings), ttl=timedelta(seconds=settings.approvals.ttl_seconds)
        ),
        audit=storage.audit,
    )
    inbox = ApprovalInbox(settings)
    shell = ServiceShell(
        service="stages",
        health=health,
        http_host=settings.observability.metrics_host,
        http_port=settings.streams.http_port,
        routes=[approval_routes(settings, inbox=inbox, keys=keys, catalog=catalog)],
    )
    if prepare is not None:
        shell.on_startup.append(prepare)
    shell.on_startup.append(StartupHook(name="policy feed", run=feed.catch_up))

    async def follow_freezes() -> None:
        await retrying(
            partial(freezes.follow, freezes_ready), retry_on=(KafkaError, OSError), what="controls"
        )

    shell.side_tasks.append(SideTask(name="freezes", run=follow_freezes))
    shell.side_tasks.append(SideTask(name="policy feed", run=feed.follow))
    shell.on_shutdown.append(storage.close)
    shell.on_shutdown.append(inbox.close)

    async def shutdown_tracer() -> None:
        observer.tracer.shutdown()

    shell.on_shutdown.append(shutdown_tracer)
    return shell, stateless, freezes_ready


async def run_stages(
    settings: Settings, *, catalog: Catalog, feed: PolicyFeed, prepare: StartupHook | None = None
) -> int:
    """Run `ratifier stages` until a signal (or a dead side task) stops it; the exit code."""
    shell, stateless, freezes_ready = stages_shell(
        settings, catalog=catalog, feed=feed, prepare=prepare
    )

    async def consume(stop: asyncio.Event) -> None:
        ready = asyncio.create_task(freezes_ready.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        stopped.cancel()
        if stop.is_set():
            return
        runner = asyncio.create_task(stateless.run())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({runner, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not runner.done():
            stateless.stop()  # the loops finish their batch and commit
        await runner
        if not stateless.stages:  # no stage here: serve the approval API until stopped
            shell.health.running()
            await stop.wait()

    return await shell.run(consume)
