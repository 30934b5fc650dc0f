"""The helpdesk catalog and its policies, tested offline with `ratifier.testing`: the loader
fixture reuses the loader's own pure part (`visible_ticket`) on rows kept in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.helpdesk import TicketFacts, visible_ticket
from ratifier.testing import Kit, kit_fixture
from schemas.envelopes import Actor

POLICIES = Path(__file__).parent / "policies"
ROWS = {
    ("tenant-a", "tkt_1"): {"subject": "Refund please", "status": "open", "requester": "carol"},
    ("tenant-a", "tkt_2"): {"subject": "Login broken", "status": "open", "requester": "dave"},
}


def tickets(actor: Actor, args: Any) -> Any:
    row = ROWS.get((actor.tenant, args.ticket_id))
    full = {"tenant": actor.tenant, "ticket_id": args.ticket_id, **row} if row else None
    return visible_ticket(full, actor)


kit = kit_fixture("examples.helpdesk:catalog", POLICIES, loaders={"get_ticket": tickets})


def test_customers_read_the_tickets_they_opened(kit: Kit) -> None:
    run = kit.call("get_ticket", {"ticket_id": "tkt_1"}, sub="carol")
    assert run.status == "auto"
    assert run.policies == ("ticket-read-own-tenant",)


def test_another_customers_ticket_answers_like_a_missing_one(kit: Kit) -> None:
    foreign = kit.call("get_ticket", {"ticket_id": "tkt_2"}, sub="carol")
    missing = kit.call("get_ticket", {"ticket_id": "tkt_404"}, sub="carol")
    other_tenant = kit.call("get_ticket", {"ticket_id": "tkt_1"}, sub="carol", tenant="tenant-b")
    assert foreign.status == missing.status == other_tenant.status == "denied"
    assert foreign.code == missing.code == other_tenant.code
    assert foreign.model_text == missing.model_text == other_tenant.model_text
    assert foreign.error == missing.error == other_tenant.error


def test_support_agents_read_every_ticket_of_their_tenant(kit: Kit) -> None:
    assert kit.call("get_ticket", {"ticket_id": "tkt_2"}, roles=["support"]).status == "auto"


def test_closed_tickets_are_refused_with_the_policys_message(kit: Kit) -> None:
    closed = TicketFacts.resource(
        id="tkt_9",
        tenant="tenant-a",
        subject="Old",
        status="closed",
        requester="carol",
        opened_by_caller=True,
    )
    run = kit.call("get_ticket", {"ticket_id": "tkt_9"}, sub="carol", resource=closed)
    assert run.status == "denied"
    assert run.reason is not None
    assert run.reason.value == "forbid"
    assert run.policies == ("closed-ticket-staff-only",)
    assert "This ticket is closed" in run.model_text


def test_password_resets_need_support_and_a_human(kit: Kit) -> None:
    args = {"user_email": "carol@example.com", "temporary_password": "correct-horse-battery"}
    agent = Actor(sub="sam", tenant="tenant-a", roles=("support",))
    assert kit.call("reset_password", args, actor=agent).status == "awaiting_approval"
    customer = kit.call("reset_password", args, sub="carol")
    assert customer.status == "denied"
    assert customer.reason is not None
    assert customer.reason.value == "no_permit"


def test_bad_arguments_are_rejected_with_a_field_path(kit: Kit) -> None:
    run = kit.call("get_ticket", {"ticket_id": "TICKET-1"})
    assert run.status == "rejected"
    assert run.error is not None
    assert run.error.fields[0].path == "$.arguments.ticket_id"
