"""`ratifier freeze` / `unfreeze` / `freezes`: the kill switch from the command line
(docs/kill-switch.md). The operator's token is verified and their right to the scope checked
by Cedar policy (approvals/operators.py) before anything is published."""

from __future__ import annotations

import argparse
import asyncio

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


def cmd_freeze(settings: Settings, args: argparse.Namespace) -> int:
    frozen = args.command == "freeze"
    operator = operator_from(args.token, context_keys(settings))
    record = asyncio.run(
        throw_switch(
            settings,
            OperatorRights.from_directory(),
            operator,
            scope_text=args.scope,
            frozen=frozen,
            reason=args.reason,
        )
    )
    print(f"{'FROZEN' if frozen else 'unfrozen'}: {_line(record)}")
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
