"""A complete example catalog that lives outside ratifier (a plugin): one read tool and one
write tool, its own table (``migrations/``), its Cedar policies (``policies/``), its approver
rules (``policies/approvers/``, loaded with ratifier's reference set) and a test written with
`ratifier.testing` (``test_helpdesk.py``).

Run ratifier with it::

    export RATIFIER_CATALOG=examples.helpdesk:catalog
    export RATIFIER_POLICIES__DIRECTORY=examples/helpdesk/policies
    ratifier migrate      # ours, then helpdesk/0001_tickets
    ratifier streams & ratifier executor &
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import StringConstraints

from commands.catalog import (
    Catalog,
    Connection,
    ExecutionContext,
    HandlerResult,
    Resource,
    ResourceFacts,
    Secret,
    Tool,
    ToolArguments,
)
from commands.sql import named_query
from schemas.envelopes import Actor, Effect

TicketId = Annotated[str, StringConstraints(pattern=r"^tkt_[0-9A-Za-z]+$", max_length=40)]


class GetTicketArguments(ToolArguments):
    ticket_id: TicketId


class ResetPasswordArguments(ToolArguments):
    user_email: Annotated[str, StringConstraints(max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")]
    # Shown as *** in approval previews and logs; as a salted hash in the audit log.
    temporary_password: Annotated[str, StringConstraints(min_length=12, max_length=64)] = Secret()


class TicketFacts(ResourceFacts):
    """What policies know of a ticket: stored columns and one computed fact."""

    kind = "ticket"
    # The customer who opened the ticket is its owner (who may confirm a call on it).
    owner_attribute = "requester"
    subject: str
    status: str
    requester: str
    # Computed by the loader from the row and the actor: policies compare, they do not join.
    opened_by_caller: bool


def visible_ticket(row: dict[str, Any] | None, actor: Actor) -> Resource | None:
    """The ticket as policies see it, or None when ``actor`` may not know it exists: support
    agents see their tenant's tickets, customers only the ones they opened. Another
    customer's ticket answers exactly like a missing one (`not_found`), so ids cannot be
    probed. Pure, so tests (and `ratifier.testing` loader fixtures) reuse it."""
    if row is None or row["tenant"] != actor.tenant:
        return None
    if "support" not in actor.roles and row["requester"] != actor.sub:
        return None
    return TicketFacts.resource(
        id=row["ticket_id"],
        tenant=row["tenant"],
        subject=row["subject"],
        status=row["status"],
        requester=row["requester"],
        opened_by_caller=row["requester"] == actor.sub,
    )


async def load_ticket(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    async with conn.cursor() as cur:
        await cur.execute(
            named_query(__name__, "ticket_by_id"),
            {"tenant": actor.tenant, "ticket_id": args.ticket_id},
        )
        row = await cur.fetchone()
    return visible_ticket(dict(row) if row is not None else None, actor)


async def get_ticket(ctx: ExecutionContext) -> HandlerResult:
    assert ctx.resource is not None
    facts = {k: v for k, v in ctx.resource.attributes.items() if k != "opened_by_caller"}
    return HandlerResult(result={"id": ctx.resource.id, **facts}, resource_id=ctx.resource.id)


async def reset_password(ctx: ExecutionContext) -> HandlerResult:
    return HandlerResult(result={"reset": True}, resource_id=None)


catalog = Catalog(
    [
        Tool(
            name="get_ticket",
            description="Read one support ticket of the caller's tenant.",
            arguments=GetTicketArguments,
            effect=Effect.READ,
            load=load_ticket,
            resource=TicketFacts,
            handler=get_ticket,
        ),
        Tool(
            name="reset_password",
            description="Reset a user's password to a temporary one.",
            arguments=ResetPasswordArguments,
            effect=Effect.EXTERNAL_WRITE,
            handler=reset_password,
        ),
    ],
    name="helpdesk",
    migrations=Path(__file__).parent / "migrations",
    approver_policies=Path(__file__).parent / "policies" / "approvers",
)
