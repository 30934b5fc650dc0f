"""`ratifier freeze` / `unfreeze` / `freezes`: the kill switch from the command line
(docs/kill-switch.md). The operator's token is verified and their right to the scope checked
by Cedar policy (approvals/operators.py) before anything is published.

The command an operator runs in an incident: it imports only what it uses (no catalog, no
PostgreSQL or Redis driver), publishes with a one-shot producer and returns as soon as the
broker has acknowledged the record, printing when the freeze is in force."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime

from approvals.operators import OperatorRights, operator_from, throw_switch
from config.settings import Settings
from feeds.freezes import FleetFreezes
from runtime.identity import context_keys
from schemas.envelopes import FreezeRecord


def _line(record: FreezeRecord) -> str:
    return (
        f"{record.scope:40}  by {record.by:20}  since {record.at.isoformat(timespec='seconds')}"
        f"  {record.reason}"
    )


def _instant(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def cmd_freeze(settings: Settings, args: argparse.Namespace, *, invoked: float) -> int:
    """``invoked``: the wall-clock time the command started (its process, as near as Python
    sees it), from which the acknowledgement's delay is reported."""
    frozen = args.command == "freeze"
    operator = operator_from(args.token, context_keys(settings))
    thrown = asyncio.run(
        throw_switch(
            settings,
            OperatorRights.from_directory(),
            operator,
            scope_text=args.scope,
            frozen=frozen,
            reason=args.reason,
        )
    )
    record, at = thrown.record, thrown.acknowledged_at
    took = at.timestamp() - invoked
    if frozen:
        print(
            f"FROZEN {record.scope}: in force since {_instant(at)} (the broker's "
            f"acknowledgement, {took:.2f} s after the command started); every stage refuses "
            f"what it stops from then on, within 1 s.\n  by {record.by} ({record.by_tenant}): "
            f"{record.reason}"
        )
    else:
        print(
            f"unfrozen {record.scope}: lifted since {_instant(at)} (acknowledged {took:.2f} s "
            f"after the command started); other frozen scopes still apply.\n  by {record.by} "
            f"({record.by_tenant}): {record.reason}"
        )
    return 0


async def current_freezes(settings: Settings) -> list[FreezeRecord]:
    """The scopes frozen now, read from the `controls` topic to its end."""
    view = FleetFreezes(settings)
    try:
        await view.catch_up()
    finally:
        await view.close()
    return view.current.records()


def cmd_freezes(settings: Settings, _args: argparse.Namespace) -> int:
    records = asyncio.run(current_freezes(settings))
    print(f"{len(records)} frozen scope(s)")
    for record in records:
        print(_line(record))
    return 0
