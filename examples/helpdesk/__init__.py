"""A complete example catalog that lives outside ratifier: one read tool and one write tool,
its Cedar policies (``policies/``) and a test written with `ratifier.testing`
(``test_helpdesk.py``).

Run ratifier with it::

    RATIFIER_CATALOG=examples.helpdesk:catalog \
    RATIFIER_POLICY_DIR=examples/helpdesk/policies ratifier streams
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
    ResourceFacts,
    Secret,
    Tool,
    ToolArguments,
)
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
    subject: str
    status: str
    requester: str
    # Computed by the loader from the row and the actor: policies compare, they do not join.
    opened_by_caller: bool


async def load_ticket(
    conn: Connection, actor: Actor, args: Any, for_update: bool
) -> Resource | None:
    # A real catalog runs a named .sql file with the tenant in its WHERE; this example keeps
    # its tickets in memory so that it runs without a schema of its own.
    ticket = TICKETS.get((actor.tenant, args.ticket_id))
    if ticket is None:
        return None
    if "support" not in actor.roles and ticket["requester"] != actor.sub:
        # Ownership decided at load time: another customer's ticket answers exactly like a
        # missing one (not_found), so ticket ids cannot be probed.
        return None
    return TicketFacts.resource(
        id=args.ticket_id,
        tenant=actor.tenant,
        **ticket,
        opened_by_caller=ticket["requester"] == actor.sub,
    )


async def get_ticket(ctx: ExecutionContext) -> HandlerResult:
    assert ctx.resource is not None
    return HandlerResult(
        result={"id": ctx.resource.id, **ctx.resource.attributes}, resource_id=ctx.resource.id
    )


async def reset_password(ctx: ExecutionContext) -> HandlerResult:
    return HandlerResult(result={"reset": True}, resource_id=None)


TICKETS: dict[tuple[str, str], dict[str, Any]] = {
    ("tenant-a", "tkt_1"): {"subject": "Refund please", "status": "open", "requester": "carol"},
    ("tenant-a", "tkt_2"): {"subject": "Login broken", "status": "open", "requester": "dave"},
}

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
    ]
)
