"""`ratifier` — one command for every process and operator task.

Module-level imports are the standard library's only: every command imports what it uses
when it runs, so `ratifier --help` and the operator's commands (`freeze` above all) start
without loading the server (`tests/unit/test_cli_imports.py` keeps it so)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

# When this command started, as near as Python sees it (`ratifier freeze` reports from it).
INVOKED = time.time()

if TYPE_CHECKING:
    from config.settings import Settings
    from executors.crash_points import CrashPoints

log = logging.getLogger("ratifier")


def database_conninfo(settings: Settings) -> str:
    from runtime.clients import database_conninfo as conninfo

    return conninfo(settings)


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.observability.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # aiokafka narrates every rebalance and metadata change at INFO.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))


def schema_and_topics(settings: Settings) -> Callable[[], Awaitable[None]]:
    """A worker's start-up hook: the schema is current (ConfigurationError if behind, which
    stops the start), then the topics exist; PostgreSQL or the broker away: retried."""

    async def prepare() -> None:
        from ratifier.migrate import require_current_schema
        from ratifier.topics import ensure_topics

        await asyncio.to_thread(
            require_current_schema, database_conninfo(settings), catalog=settings.catalog
        )
        await ensure_topics(settings)

    return prepare


def cmd_topics(settings: Settings, _args: argparse.Namespace) -> int:
    from ratifier.topics import ensure_topics

    created = asyncio.run(ensure_topics(settings))
    print(
        f"topics: {len(created)} created under prefix {settings.topic_prefix!r}"
        + (f": {', '.join(created)}" if created else " (all existed)")
    )
    return 0


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from ratifier.migrate import migrate

    applied = migrate(database_conninfo(settings))
    print(
        f"migrate: {len(applied)} applied"
        + (f": {', '.join(applied)}" if applied else " (up to date)")
    )
    return 0


def cmd_migrate_approvals(settings: Settings, _args: argparse.Namespace) -> int:
    """Upgrade from the faust join: its changelog's approval states into PostgreSQL."""
    from ratifier.approvals_upgrade import migrate_approvals
    from ratifier.migrate import require_current_schema

    require_current_schema(database_conninfo(settings), catalog=settings.catalog)
    print(asyncio.run(migrate_approvals(settings)).render())
    return 0


def cmd_token(settings: Settings, args: argparse.Namespace) -> int:
    from runtime.identity import context_keys, issue_context_token

    print(
        issue_context_token(
            context_keys(settings),
            sub=args.sub,
            tenant=args.tenant,
            roles=tuple(args.role or ()),
            ttl_seconds=args.ttl,
        )
    )
    return 0


def cmd_approval_join(settings: Settings, args: argparse.Namespace) -> int:
    """The approval-join on the runtime (streams/join_service.py), its state in PostgreSQL."""
    from commands.catalog import load_catalog
    from feeds.policies import PolicyFeed, local_policies
    from streams.join_service import run_approval_join

    feed = PolicyFeed(settings, local_policies(settings))
    return asyncio.run(
        run_approval_join(
            settings,
            load_catalog(settings.catalog),
            feed,
            prepare=schema_and_topics(settings),
            crash_points=args.crash_points,
        )
    )


def cmd_stages(settings: Settings, _args: argparse.Namespace) -> int:
    """The stateless stages and the approval HTTP API, on the runtime (no faust)."""
    from commands.catalog import load_catalog
    from feeds.policies import PolicyFeed, local_policies
    from runtime.shell import StartupHook
    from streams.stages_service import run_stages

    feed = PolicyFeed(settings, local_policies(settings))
    hook = StartupHook(name="schema and topics", run=schema_and_topics(settings))
    return asyncio.run(
        run_stages(settings, catalog=load_catalog(settings.catalog), feed=feed, prepare=hook)
    )


def cmd_streams(settings: Settings, _args: argparse.Namespace) -> int:
    """`ratifier stages` and `ratifier approval-join` as two child processes (one runtime
    each), for one host; the stages serve the HTTP port, the join `streams.join_http_port`."""
    from ratifier.processes import run_together

    return run_together(
        {
            "stages": ["stages"],
            "approval-join": ["approval-join"],
        },
        env={
            "approval-join": {"RATIFIER_STREAMS__HTTP_PORT": str(settings.streams.join_http_port)}
        },
    )


def cmd_executor(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog
    from executors.service import run_executor
    from feeds.policies import PolicyFeed, local_policies
    from ratifier.migrate import require_current_schema
    from ratifier.topics import ensure_topics

    _setup_logging(settings)
    require_current_schema(database_conninfo(settings), catalog=settings.catalog)
    feed = PolicyFeed(settings, local_policies(settings))
    # Topics are created once the broker answers (health is served meanwhile).
    return run_executor(
        settings,
        catalog=load_catalog(settings.catalog),
        policies=feed,
        prepare=lambda: ensure_topics(settings),
        crash_points=args.crash_points,
    )


def _policy_dir(settings: Settings, args: argparse.Namespace) -> Path:
    from commands.policy import DEFAULT_POLICY_DIR

    return Path(args.policies or settings.policies.directory or DEFAULT_POLICY_DIR)


def cmd_policy_check(settings: Settings, args: argparse.Namespace) -> int:
    from approvals.policy import approver_policy_sources, check_approver_policies
    from commands.catalog import load_catalog
    from commands.policy import check_policy_directory

    directory = _policy_dir(settings, args)
    catalog = load_catalog(settings.catalog)
    # The approver policies the approval-join would load for this catalog (or a candidate).
    approvers = approver_policy_sources(
        catalog, args.approver_policies or settings.approvals.approver_policy_dir
    )
    problems = check_policy_directory(directory, catalog) + check_approver_policies(approvers)
    for problem in problems:
        print(problem)
    print(
        f"policy check: {directory} (approver policies: {approvers}): "
        + (f"{len(problems)} problem(s)" if problems else f"OK for catalog {settings.catalog}")
    )
    return 1 if problems else 0


def cmd_policy_schema(settings: Settings, args: argparse.Namespace) -> int:
    from approvals.policy import APPROVER_SCHEMA
    from commands.catalog import load_catalog
    from commands.cedar_schema import generate_schema
    from commands.policy import DEFAULT_POLICY_DIR, directory_budgets

    if args.approvers:
        # The approver policies' schema is ratifier's, the same for every catalog.
        sys.stdout.write(APPROVER_SCHEMA.read_text(encoding="utf-8"))
        return 0
    # The budgets beside the policies are declared in each action's `context.budgets`.
    budgets = directory_budgets(Path(settings.policies.directory or DEFAULT_POLICY_DIR))
    generated = generate_schema(load_catalog(settings.catalog), budgets)
    for problem in generated.problems:
        print(problem, file=sys.stderr)
    sys.stdout.write(generated.text())
    return 1 if generated.problems else 0


def cmd_policy_status(settings: Settings, _args: argparse.Namespace) -> int:
    from feeds.policies import policy_status

    status = asyncio.run(policy_status(settings))
    print(status.render())
    return 0 if not status.differs else 3


def cmd_policy_publish(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog
    from commands.policy import PolicySet, check_policy_directory
    from feeds.policies import local_policies, policy_record, publish_policies
    from ratifier.topics import ensure_topics

    problems = check_policy_directory(_policy_dir(settings, args), load_catalog(settings.catalog))
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"policy publish: refused, {len(problems)} problem(s)", file=sys.stderr)
        return 1
    policies = (
        PolicySet.from_directory(Path(args.policies)) if args.policies else local_policies(settings)
    )
    asyncio.run(ensure_topics(settings))
    asyncio.run(publish_policies(settings, policy_record(settings, policies)))
    print(f"published policy set {settings.policies.set_name!r} version {policies.version}")
    return 0


def cmd_policy_replay(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog
    from commands.policy import PolicySet
    from feeds.policies import PolicyFeed, local_policies
    from ratifier.policy_replay import replay
    from runtime.identity import context_keys

    candidate = PolicySet.from_directory(Path(args.policies))
    feed = PolicyFeed(settings, local_policies(settings))
    asyncio.run(feed.catch_up())  # the set in force is the newest published one
    since = datetime.fromisoformat(args.since) if args.since else None
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    report = asyncio.run(
        replay(
            settings,
            catalog=load_catalog(settings.catalog),
            keys=context_keys(settings),
            current=feed.current,
            candidate=candidate,
            since=since,
            from_offset=args.from_offset,
        )
    )
    print(report.render())
    return 0


def cmd_approvals(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from approvals.inbox import ApprovalInbox, approver_from, publish_decision, statement_of
    from approvals.signing import approval_keys, sign_decision
    from runtime.identity import context_keys
    from schemas.envelopes import ApprovalVerdict

    secret = settings.approver_token
    token = args.token or (secret.get_secret_value() if secret is not None else None)
    approver = approver_from(token, context_keys(settings))
    inbox = ApprovalInbox(settings)

    async def read_inbox() -> None:
        try:
            await inbox.catch_up()
        finally:
            await inbox.close()

    asyncio.run(read_inbox())
    if args.approvals_command == "list":
        pending = inbox.pending(approver.tenant)
        print(f"{len(pending)} pending in {approver.tenant}")
        for request in pending:
            left = (request.expires_at - datetime.now(UTC)).total_seconds()
            print(
                f"{request.call_id:36}  {request.tool:24}  by {request.requested_by:16}  "
                f"{left:6.0f}s left  {request.preview[1] if len(request.preview) > 1 else ''}"
            )
        return 0
    request = inbox.get(approver.tenant, args.call_id)
    if args.approvals_command == "show":
        print(json.dumps(request.model_dump(mode="json"), indent=2))
        return 0
    verdict = ApprovalVerdict(args.approvals_command)
    arguments = json.loads(args.arguments) if verdict is ApprovalVerdict.EDIT else None
    keys = approval_keys(settings)
    statement = statement_of(
        request,
        approver=approver,
        keys=keys,
        verdict=verdict,
        reason=args.reason,
        arguments=arguments,
    )
    decision = sign_decision(statement, keys)
    asyncio.run(publish_decision(settings, decision))
    print(
        f"published {verdict.value} for {request.call_id} (fingerprint "
        f"{request.fingerprint[:12]}…, decision {decision.decision_id}); "
        "the outcome follows on the outcomes topic"
    )
    return 0


def cmd_limits(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.limits import report

    print("\n".join(asyncio.run(report(settings, local=args.local, tenant=args.tenant))))
    return 0


def cmd_freeze(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.freeze import cmd_freeze as freeze

    return freeze(settings, args, invoked=INVOKED)


def cmd_freezes(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.freeze import cmd_freezes as freezes

    return freezes(settings, args)


def cmd_reconciler(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog
    from executors.reconciler import run_reconciler

    prepare = schema_and_topics(settings)
    # The schema check and topics are a start-up hook of the service shell: a database or
    # broker unreachable at start delays it, never ends it (a schema behind the build does).
    catalog = load_catalog(settings.catalog)
    return asyncio.run(
        run_reconciler(settings, catalog, prepare=prepare, crash_points=args.crash_points)
    )


def cmd_notifier(settings: Settings, args: argparse.Namespace) -> int:
    from approvals.notifier import run_notifier
    from approvals.notify import load_directory

    # A bad endpoints file (or a secret that is not set) stops the start: no unsigned sends.
    directory = load_directory(settings.notifications.endpoints_file)
    return asyncio.run(run_notifier(settings, directory, prepare=schema_and_topics(settings)))


def cmd_ops(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.ops import (
        describe_unknown,
        list_unknown,
        resolve_operation,
        resolver_from,
        unpublished_settlements,
    )

    if args.ops_command == "unknown":
        rows = asyncio.run(list_unknown(settings, tenant=args.tenant))
        print("\n".join(describe_unknown(rows, datetime.now(UTC))))
        owed = asyncio.run(unpublished_settlements(settings))
        if owed["owed"]:
            print(
                f"{owed['owed']} settled outcomes not yet published (oldest "
                f"{owed['oldest_age_seconds']:.0f}s): the reconciler publishes them"
            )
        return 0
    if args.by is not None:
        print(
            "ratifier ops resolve: --by is gone; the operator's identity comes from their "
            "verified --token (docs/upgrading.md)",
            file=sys.stderr,
        )
        return 2
    if not args.token:
        print("ratifier ops resolve: needs --token (an operator's token)", file=sys.stderr)
        return 2
    operator = resolver_from(settings, args.token, args.operation_id)
    outcome = asyncio.run(
        resolve_operation(
            settings,
            args.operation_id,
            applied=args.applied,
            reference=args.reference,
            by=operator,
        )
    )
    if outcome is None:
        print(f"{args.operation_id}: no unknown operation with that id", file=sys.stderr)
        return 1
    print(
        f"{args.operation_id}: resolved as {outcome.status.value} by {operator.sub} "
        f"({operator.tenant}); recorded in the audit, outcome published"
    )
    return 0


def cmd_budgets(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.budgets import report

    print("\n".join(asyncio.run(report(settings, tenant=args.tenant, local=args.local))))
    return 0


def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog

    if args.audit_command == "sink":
        from audit.sink import run_audit_sink

        # The schema check and topics wait for PostgreSQL and the broker (runtime/shell.py).
        return run_audit_sink(settings, load_catalog(settings.catalog), schema_and_topics(settings))
    from audit.show import show_call

    return show_call(
        settings,
        load_catalog(settings.catalog),
        args.call_id,
        tenant=args.tenant,
        as_json=args.json,
    )


def cmd_dashboard(settings: Settings, args: argparse.Namespace) -> int:
    from dashboard.server import run_dashboard

    run_dashboard(settings, port=args.port)
    return 0


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    from commands.catalog import load_catalog
    from ratifier.mcp_gateway import McpGateway, serve_http, serve_stdio
    from ratifier_client.adapters.confirmation import ConfirmationApi
    from ratifier_client.client import RatifierClient
    from runtime.identity import context_keys, verify_context_token

    keys = context_keys(settings)
    fixed: str | None = None
    if args.transport == "stdio":
        if not args.context_token_file:
            print("ratifier mcp: stdio needs --context-token-file", file=sys.stderr)
            return 2
        fixed = Path(args.context_token_file).read_text(encoding="utf-8").strip()
        verify_context_token(fixed, keys)  # refuse to start with a token the pipeline refuses

    async def serve() -> None:
        async with RatifierClient.from_settings(settings, replies=args.replies) as client:
            catalog = load_catalog(settings.catalog)
            approvals_url = args.approvals_url or (
                f"http://127.0.0.1:{settings.streams.http_port}"
                if settings.streams.http_port
                else None
            )
            gateway = McpGateway(
                catalog=catalog,
                client=client,
                keys=keys,
                fixed_context=fixed,
                confirmations=ConfirmationApi(base_url=approvals_url) if approvals_url else None,
            )
            if args.transport == "stdio":
                await serve_stdio(gateway)
            else:
                port = args.port or settings.mcp_port
                await serve_http(gateway, host=args.host, port=port, issuer_url=args.issuer_url)

    asyncio.run(serve())
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.demo import run_demo

    return run_demo(settings, timeout=args.timeout)


def cmd_schemas(_settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.contract_export import main as export_main

    return export_main([args.dir] if args.dir else [])


def cmd_catalog_export(settings: Settings, args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from commands.catalog import load_catalog
    from commands.export import export_catalog

    exported = export_catalog(load_catalog(settings.catalog), args.format)
    text = json.dumps(exported, indent=2, ensure_ascii=False) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text, encoding="utf-8")
    print(f"catalog export: {len(exported)} tools ({args.format}) written to {args.output}")
    return 0


def cmd_check_call(settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.testing.check_call import check_call

    run = asyncio.run(check_call(settings, Path(args.file)))
    print(run.explain())
    return 0 if run.permitted else 1


def cmd_keys_generate(_settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.keys import exports, generate_keys

    generated = generate_keys(
        Path(args.out), mounted_at=args.mounted_at, kid=args.kid, force=args.force
    )
    sys.stdout.write(exports(generated))
    return 0


def cmd_catalog_import(_settings: Settings, args: argparse.Namespace) -> int:
    from ratifier.testing.scaffold import scaffold_catalog

    source = scaffold_catalog(Path(args.file))
    if args.output is None:
        sys.stdout.write(source)
        return 0
    Path(args.output).write_text(source, encoding="utf-8")
    print(f"catalog import: argument models written to {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratifier", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("topics", help="create all topics (idempotent)").set_defaults(func=cmd_topics)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)
    sub.add_parser(
        "migrate-approvals",
        help="upgrade from the faust approval-join: copy the approval states of its changelog "
        "topic into PostgreSQL (once, with every approval-join stopped)",
    ).set_defaults(func=cmd_migrate_approvals)
    sub.add_parser(
        "streams", help="run `stages` and `approval-join` together (two processes, one host)"
    ).set_defaults(func=cmd_streams)
    sub.add_parser(
        "stages", help="run the validator and authorizer, and the approval HTTP API"
    ).set_defaults(func=cmd_stages)
    sub.add_parser(
        "approval-join", help="run an approval-join worker (its state in PostgreSQL)"
    ).set_defaults(func=cmd_approval_join)
    sub.add_parser("executor", help="run an executor process").set_defaults(func=cmd_executor)
    token = sub.add_parser("token", help="issue a local context token (HS256)")
    token.add_argument("--tenant", required=True)
    token.add_argument("--sub", required=True, help="user id")
    token.add_argument("--role", action="append", help="role (repeatable)")
    token.add_argument("--ttl", type=int, default=3600, help="seconds until expiry")
    token.set_defaults(func=cmd_token)
    demo = sub.add_parser("demo", help="run the pipeline on a short scenario")
    demo.add_argument("--timeout", type=float, default=120.0)
    demo.set_defaults(func=cmd_demo)
    policy = sub.add_parser("policy", help="publish or replay Cedar policy sets")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    publish = policy_sub.add_parser("publish", help="publish a policy set to running services")
    publish.add_argument(
        "--policies", help="directory (default: RATIFIER_POLICIES__DIRECTORY or ours)"
    )
    publish.set_defaults(func=cmd_policy_publish)
    check = policy_sub.add_parser(
        "check", help="check a policy set against the catalog's schema; every error, file:line"
    )
    check.add_argument(
        "--policies", help="directory (default: RATIFIER_POLICIES__DIRECTORY or ours)"
    )
    check.add_argument(
        "--approver-policies",
        help="approver policy directory to check instead of the catalog's and the reference "
        "set (default: RATIFIER_APPROVALS__APPROVER_POLICY_DIR, if set)",
    )
    check.set_defaults(func=cmd_policy_check)
    schema = policy_sub.add_parser(
        "schema", help="print the Cedar schema generated from the catalog (RATIFIER_CATALOG)"
    )
    schema.add_argument(
        "--approvers", action="store_true", help="print the approver policies' schema instead"
    )
    schema.set_defaults(func=cmd_policy_schema)
    policy_sub.add_parser(
        "status", help="the policy set in force (published) and whether the local folder differs"
    ).set_defaults(func=cmd_policy_status)
    replay = policy_sub.add_parser(
        "replay", help="re-decide past proposals under a candidate set; no effects"
    )
    replay.add_argument("--policies", required=True, help="candidate policy directory")
    start = replay.add_mutually_exclusive_group()
    start.add_argument("--since", help="ISO time, e.g. 2026-11-29T12:00:00Z")
    start.add_argument("--from-offset", type=int, help="offset in every partition")
    replay.set_defaults(func=cmd_policy_replay)
    budgets = sub.add_parser(
        "budgets", help="spending budgets in force with each window's usage and reset time"
    )
    budgets.add_argument("--tenant", required=True)
    budgets.add_argument(
        "--local", action="store_true", help="the local policy folder's budgets, not the topic's"
    )
    budgets.set_defaults(func=cmd_budgets)
    approvals = sub.add_parser("approvals", help="the approval inbox (needs an approver token)")
    approvals.add_argument("--token", help="approver token (default: $RATIFIER_APPROVER_TOKEN)")
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    approvals_sub.add_parser("list", help="pending requests of your tenant")
    for name, text in (
        ("show", "one request with its preview"),
        ("approve", "approve it"),
        ("reject", "reject it"),
        ("edit", "approve with changed arguments"),
    ):
        one = approvals_sub.add_parser(name, help=text)
        one.add_argument("call_id")
        if name != "show":
            one.add_argument("--reason")
        if name == "edit":
            one.add_argument("--arguments", required=True, help="the new arguments as JSON")
    approvals.set_defaults(func=cmd_approvals, reason=None)
    sub.add_parser("reconciler", help="run a reconciler process").set_defaults(func=cmd_reconciler)
    for name, text in (("freeze", "freeze a scope (the kill switch)"), ("unfreeze", "lift it")):
        switch = sub.add_parser(name, help=text)
        switch.add_argument(
            "--scope",
            required=True,
            help="tenant:T, agent:T:sub, subject:T:sub, tool:T:name, writes:T or writes:*",
        )
        switch.add_argument("--reason", required=True, help="why (kept in the audit)")
        switch.add_argument("--token", required=True, help="an operator's token (role operator)")
        switch.set_defaults(func=cmd_freeze)
    sub.add_parser("freezes", help="list the frozen scopes").set_defaults(func=cmd_freezes)
    limits = sub.add_parser(
        "limits", help="admission limits in force and the fleet's usage of each live bucket"
    )
    limits.add_argument("--tenant", help="only this tenant's buckets")
    limits.add_argument(
        "--local", action="store_true", help="the local policy folder's limits, not the topic's"
    )
    limits.set_defaults(func=cmd_limits)
    sub.add_parser(
        "notifier", help="deliver approval requests to the tenants' webhooks (signed)"
    ).set_defaults(func=cmd_notifier)
    ops = sub.add_parser("ops", help="operations with unknown outcomes")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True)
    ops_unknown = ops_sub.add_parser("unknown", help="list unknown and escalated operations")
    ops_unknown.add_argument("--tenant")
    resolve = ops_sub.add_parser("resolve", help="settle an escalated operation by hand")
    resolve.add_argument("operation_id", help="tenant:idempotency_key")
    verdict = resolve.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--applied", action="store_true", dest="applied", default=None)
    verdict.add_argument("--not-applied", action="store_false", dest="applied")
    resolve.add_argument("--reference", help="the downstream system's reference, if applied")
    resolve.add_argument(
        "--token",
        help="an operator's token (role operator, the operation's tenant): their identity is "
        "recorded in the audit",
    )
    # Before v0.2 a free-text name; refused with a pointer, not silently ignored.
    resolve.add_argument("--by", help=argparse.SUPPRESS)
    ops.set_defaults(func=cmd_ops)
    audit = sub.add_parser("audit", help="the audit log: run its sink, or show a call's story")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    audit_sub.add_parser("sink", help="record every pipeline record (secrets masked) in PostgreSQL")
    audit_show = audit_sub.add_parser("show", help="a call's whole story, in time order")
    audit_show.add_argument("call_id")
    audit_show.add_argument("--tenant", help="only this tenant's records of the call")
    audit_show.add_argument("--json", action="store_true", help="the events as JSON")
    audit.set_defaults(func=cmd_audit)
    dashboard = sub.add_parser(
        "dashboard", help="serve the web dashboard and approval inbox on 127.0.0.1"
    )
    dashboard.add_argument("--port", type=int, help="default: RATIFIER_DASHBOARD_PORT (6070)")
    dashboard.set_defaults(func=cmd_dashboard)
    mcp = sub.add_parser(
        "mcp", help="serve the catalog over MCP (streamable HTTP on /mcp, or stdio)"
    )
    mcp.add_argument("--transport", choices=("http", "stdio"), default="http")
    mcp.add_argument("--host", default="127.0.0.1")
    mcp.add_argument("--port", type=int, help="default: RATIFIER_MCP_PORT (6071)")
    mcp.add_argument(
        "--issuer-url", help="authorization server named in the resource metadata (default: self)"
    )
    mcp.add_argument(
        "--context-token-file", help="stdio: the local user's signed context token, in a file"
    )
    mcp.add_argument(
        "--approvals-url",
        help="the approval API end users confirm through (MCP elicitation); "
        "default: http://127.0.0.1:RATIFIER_STREAMS__HTTP_PORT",
    )
    mcp.add_argument(
        "--replies",
        action="store_true",
        help="read outcomes from a reply topic of the gateway's own (created under "
        "<prefix>replies., deleted on exit) instead of home partitions of outcomes",
    )
    mcp.set_defaults(func=cmd_mcp)
    schemas = sub.add_parser("schemas", help="write JSON Schema files of the contract")
    schemas.add_argument("dir", nargs="?")
    schemas.set_defaults(func=cmd_schemas)
    catalog = sub.add_parser("catalog", help="inspect the tool catalog (RATIFIER_CATALOG)")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    export = catalog_sub.add_parser(
        "export", help="write the catalog's tool definitions for a provider, as JSON"
    )
    # commands.export.FORMATS, spelled out so that building the parser imports nothing heavy
    # (a unit test keeps the two equal).
    export.add_argument(
        "--format", required=True, choices=("openai", "anthropic", "mcp", "jsonschema")
    )
    export.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(func=cmd_catalog_export)
    importer = catalog_sub.add_parser(
        "import", help="scaffold pydantic argument models and Tool stubs from tool JSON"
    )
    source = importer.add_mutually_exclusive_group(required=True)
    for name in ("openai", "anthropic", "mcp"):
        source.add_argument(
            f"--{name}",
            dest="file",
            metavar="TOOLS.json",
            help=f"{name} tool definitions (the shape is recognised per tool)",
        )
    importer.add_argument("--output", metavar="FILE.py", help="write here instead of stdout")
    importer.set_defaults(func=cmd_catalog_import)
    keys = sub.add_parser("keys", help="key material for a deployment outside development mode")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser(
        "generate",
        help="write an Ed25519 approval signing key, its JWKS, a context secret and an audit "
        "salt (mode 0600); print the RATIFIER_* settings naming them",
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    generate.add_argument(
        "--mounted-at",
        metavar="PATH",
        help="where the services see these files (a container mount; default: DIR)",
    )
    generate.add_argument("--kid", help="key id of the signing key (default: dated)")
    generate.add_argument("--force", action="store_true", help="replace existing files")
    generate.set_defaults(func=cmd_keys_generate)
    check_call = sub.add_parser(
        "check-call", help="dry-run one proposed call offline; print the decision and reasons"
    )
    check_call.add_argument("file", metavar="FILE.json")
    check_call.set_defaults(func=cmd_check_call)
    return parser


# Commands that use no key, secret or salt (they start without key material).
_KEYLESS = frozenset(
    {"topics", "migrate", "migrate-approvals", "schemas", "catalog", "keys", "check-call", "ops"}
)
_KEYLESS_POLICY = frozenset({"check", "schema", "status", "publish"})


def _needs_keys(args: argparse.Namespace) -> bool:
    if args.command == "policy":
        return args.policy_command not in _KEYLESS_POLICY
    if args.command == "ops":  # a resolution verifies the operator's token
        return bool(args.ops_command == "resolve")
    return args.command not in _KEYLESS


def start_settings(args: argparse.Namespace) -> Settings:
    """The settings of this start, checked once: no unknown RATIFIER_* variable, and real
    key material unless in development mode (`ratifier demo` always is: a local scenario)."""
    from config.settings import Settings, check_environment

    check_environment()
    settings = Settings(development_mode=True) if args.command == "demo" else Settings()
    if _needs_keys(args):
        settings.require_key_material()
    return settings


def main(argv: Sequence[str] | None = None, *, crash_points: CrashPoints | None = None) -> int:
    """``crash_points``: where a worker may be stopped dead (crash tests inject theirs through
    `python -m testsupport.crashing`); production runs with none."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from config.settings import DEVELOPMENT_MODE_ENV
    from executors.crash_points import NO_CRASH_POINTS
    from schemas.errors import RatifierError

    args.crash_points = NO_CRASH_POINTS if crash_points is None else crash_points
    try:
        settings = start_settings(args)
    except RatifierError as exc:
        print(f"ratifier {args.command}: {exc.safe_message}", file=sys.stderr)
        return 2
    _setup_logging(settings)
    if settings.development_mode and _needs_keys(args):
        warning = (
            f"development mode is on ({DEVELOPMENT_MODE_ENV}): built-in, publicly known keys "
            "are accepted; never run a deployment like this"
        )
        log.warning(warning)
    try:
        code: int = args.func(settings, args)
    except RatifierError as exc:
        print(f"ratifier {args.command}: {exc.safe_message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
