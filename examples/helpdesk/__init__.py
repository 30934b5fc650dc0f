"""A complete example catalog that lives outside ratifier: one read tool and one write tool.

Run ratifier with it: ``RATIFIER_CATALOG=examples.helpdesk:catalog ratifier streams``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import StringConstraints

from commands.catalog import (
    Catalog,
    Connection,
    ExecutionContext,
    HandlerResult,
    Resource,
    Secret,
    Tool,
    ToolArguments,
)
from schemas.envelopes import Effect

TicketId = Annotated[str, StringConstraints(pattern=r"^tkt_[0-9A-Za-z]+$", max_length=40)]


class GetTicketArguments(ToolArguments):
    ticket_id: TicketId


class ResetPasswordArguments(ToolArguments):
    user_email: Annotated[str, StringConstraints(max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")]
    # Shown as *** in approval previews and logs; as a salted hash in the audit log.
    temporary_password: Annotated[str, StringConstraints(min_length=12, max_length=64)] = Secret()


async def load_ticket(
    conn: Connection, tenant: str, args: Any, for_update: bool
) -> Resource | None:
    # A real catalog runs a named .sql file with the tenant in its WHERE; this example keeps
    # its tickets in memory so that it runs without a schema of its own.
    ticket = TICKETS.get((tenant, args.ticket_id))
    if ticket is None:
        return None
    return Resource(kind="ticket", id=args.ticket_id, tenant=tenant, attributes=ticket)


async def get_ticket(ctx: ExecutionContext) -> HandlerResult:
    assert ctx.resource is not None
    return HandlerResult(
        result={"id": ctx.resource.id, **ctx.resource.attributes}, resource_id=ctx.resource.id
    )


async def reset_password(ctx: ExecutionContext) -> HandlerResult:
    return HandlerResult(result={"reset": True}, resource_id=None)


TICKETS: dict[tuple[str, str], dict[str, Any]] = {
    ("tenant-a", "tkt_1"): {"subject": "Refund please", "status": "open"},
}

catalog = Catalog(
    [
        Tool(
            name="get_ticket",
            description="Read one support ticket of the caller's tenant.",
            arguments=GetTicketArguments,
            effect=Effect.READ,
            load=load_ticket,
            handler=get_ticket,
        ),
        Tool(
            name="reset_password",
            description="Reset a user's password to a temporary one.",
            arguments=ResetPasswordArguments,
            effect=Effect.EXTERNAL_WRITE,
            handler=reset_password,
        ),
    ]
)
