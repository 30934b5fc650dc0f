"""Approver rules per catalog (issue 25, item 5): a catalog ships approver policies with (or
instead of) the reference set, declares whom its resources belong to, and `policy check` /
`policy schema` cover approver policies. A customer confirming their own destructive action
needs one confirmation. Texts name the right actor (item 6)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from approvals.auto import resource_owner
from approvals.policy import (
    APPROVER_SCHEMA,
    PolicyRights,
    approver_policy_sources,
    check_approver_policies,
)
from approvals.rights import PendingCall, RoleRights
from approvals.signing import DecisionRefusal, sign_decision, statement_for, verify_decision
from commands.catalog import Catalog, HandlerResult, ResourceFacts, Tool, ToolArguments
from examples.helpdesk import catalog as helpdesk
from examples.helpdesk import visible_ticket
from ratifier.cli import main
from schemas.envelopes import (
    Actor,
    ActorRef,
    ApprovalVerdict,
    AuthorizedCall,
    CommittedCommand,
    DecisionKind,
    Effect,
    Outcome,
    Route,
    Status,
)
from schemas.errors import (
    AWAITING_CONFIRMATION_MESSAGE,
    CUSTOMER_DECLINED_MESSAGE,
    SAFE_MESSAGES,
    ConfigurationError,
    ErrorCode,
)
from schemas.fingerprint import fingerprint
from schemas.providers import result_text
from streams.approval import ApprovalState, Rules, Step, on_authorized, on_decided
from tests.unit.conftest import NOW, SIGNING

REFERENCE = PolicyRights.from_directory()
HELPDESK_APPROVERS = Path(helpdesk.approver_policies or ".")


def call_of(
    tool: str,
    arguments: dict[str, Any],
    *,
    effect: Effect,
    owner: str | None = None,
    requester: str = "agent-1",
) -> AuthorizedCall:
    return AuthorizedCall(
        call_id=f"c-{tool}",
        operation_id=f"tenant-a:c-{tool}",
        idempotency_key=f"c-{tool}",
        tenant="tenant-a",
        actor=ActorRef(sub=requester, roles=("support",)),
        tool=tool,
        arguments=arguments,
        fingerprint=fingerprint(
            tenant="tenant-a", tool=tool, arguments=arguments, policy_version="p1"
        ),
        effect=effect,
        policy_version="p1",
        route=Route.APPROVAL,
        proposed_at=NOW,
        authorized_at=NOW,
        resource_owner=owner,
    )


def statement(
    call: AuthorizedCall,
    who: Actor,
    *,
    verdict: ApprovalVerdict = ApprovalVerdict.APPROVE,
    kind: DecisionKind = DecisionKind.APPROVER,
    reason: str | None = None,
) -> Any:
    return statement_for(
        call_id=call.call_id,
        tenant=call.tenant,
        fingerprint=call.fingerprint,
        approver=who,
        verdict=verdict,
        now=NOW,
        validity=timedelta(minutes=15),
        kind=kind,
        reason=reason,
    )


RESET = {"user_email": "dave@example.com", "temporary_password": "Temporary-123456"}
LEAD = Actor(sub="lena", tenant="tenant-a", roles=("support_lead",))
BOSS = Actor(sub="boss", tenant="tenant-a", roles=("approver",))


# -- a catalog's own approver policies --------------------------------------------------------


def test_the_helpdesk_ships_approver_rules_that_are_enforced() -> None:
    reset = call_of("reset_password", RESET, effect=Effect.EXTERNAL_WRITE)
    target = PendingCall(call=reset, tool=helpdesk.get("reset_password"))
    rights = PolicyRights.for_catalog(helpdesk)
    # The helpdesk's rule: support leads approve password resets.
    assert rights.refusal(statement(reset, LEAD), target) is None
    assert REFERENCE.refusal(statement(reset, LEAD), target) is (
        DecisionRefusal.APPROVER_NOT_PERMITTED
    )
    # Loaded WITH the reference set: staff approvers still decide, nobody approves their own.
    assert rights.refusal(statement(reset, BOSS), target) is None
    own = PendingCall(
        call=call_of("reset_password", RESET, effect=reset.effect, requester="lena"),
        tool=target.tool,
    )
    assert rights.refusal(statement(own.call, LEAD), own) is DecisionRefusal.SELF_APPROVAL
    # Only password resets.
    other = call_of("get_ticket", {"ticket_id": "tkt_1"}, effect=Effect.EXTERNAL_WRITE)
    assert rights.refusal(statement(other, LEAD), PendingCall(call=other, tool=None)) is (
        DecisionRefusal.APPROVER_NOT_PERMITTED
    )
    assert check_approver_policies(approver_policy_sources(helpdesk)) == []


def test_the_approval_join_loads_the_catalogs_approver_rules() -> None:
    from config.settings import Settings

    rights = PolicyRights.for_settings(Settings(), helpdesk)
    assert "helpdesk-support-lead-password-resets" in {
        a.get("id") for a in rights.policies.annotations.values()
    }
    assert "approver-role-own-tenant" in {a.get("id") for a in rights.policies.annotations.values()}


async def _handler(_ctx: Any) -> HandlerResult:
    return HandlerResult(result={})


class CaseArguments(ToolArguments):
    case_id: str


class CaseFacts(ResourceFacts):
    kind = "case"
    # Not one of the fallback names: found only because it is declared.
    owner_attribute = "opened_by"
    opened_by: str
    customer_id: str  # another attribute the fallback would have picked


def _tool(name: str, *, facts: Any = None, effect: Effect = Effect.DESTRUCTIVE) -> Tool:
    return Tool(
        name=name,
        description=name,
        arguments=CaseArguments,
        effect=effect,
        handler=_handler,
        resource=facts,
    )


ONLY_LEADS = """
@id("leads-close-cases")
permit (principal, action in [Action::"approve", Action::"reject"], resource)
when { principal.tenant == resource.tenant && principal.roles.contains("support_lead") };

@id("open-once")
permit (principal, action == Action::"open", resource);
"""


def test_a_catalog_may_replace_the_reference_set(tmp_path: Path) -> None:
    (tmp_path / "cases.cedar").write_text(ONLY_LEADS, encoding="utf-8")
    cases = Catalog(
        [_tool("close_case", facts=CaseFacts)],
        approver_policies=tmp_path,
        reference_approver_policies=False,
    )
    close = call_of("close_case", {"case_id": "k1"}, effect=Effect.DESTRUCTIVE)
    target = PendingCall(call=close, tool=cases.get("close_case"))
    rights = PolicyRights.for_catalog(cases)
    assert rights.refusal(statement(close, LEAD), target) is None
    # Instead of the reference set: its approver role and four-eyes rule do not apply.
    assert rights.refusal(statement(close, BOSS), target) is DecisionRefusal.APPROVER_NOT_PERMITTED
    assert rights.required_approvals(target) == 1
    assert approver_policy_sources(cases).directories == (tmp_path,)
    with pytest.raises(ConfigurationError, match="must ship its own"):
        Catalog([_tool("close_case")], reference_approver_policies=False)
    # A deployment's folder replaces both.
    assert approver_policy_sources(cases, "/srv/approvers").directories == (Path("/srv/approvers"),)


# -- whom a resource belongs to ---------------------------------------------------------------


def test_the_owner_attribute_is_the_declared_one() -> None:
    case = CaseFacts.resource(id="k1", tenant="tenant-a", opened_by="carol", customer_id="c-9")
    declared = _tool("close_case", facts=CaseFacts)
    assert resource_owner(case, declared) == "carol"
    # Where nothing is declared, the documented fallback names.
    assert resource_owner(case, _tool("close_case")) == "c-9"
    assert resource_owner(case) == "c-9"
    # The helpdesk declares its ticket's requester; the reference catalog its payment's
    # customer.
    ticket = visible_ticket(
        {
            "tenant": "tenant-a",
            "ticket_id": "tkt_1",
            "subject": "s",
            "status": "open",
            "requester": "carol",
        },
        Actor(sub="carol", tenant="tenant-a", roles=()),
    )
    assert resource_owner(ticket, helpdesk.get("get_ticket")) == "carol"
    with pytest.raises(ConfigurationError, match="owner_attribute"):

        class Broken(ResourceFacts):
            kind = "broken"
            owner_attribute = "missing"
            status: str


# -- four-eyes is for staff, not for the customer's own confirmation ---------------------------

RULES = Rules(keys=SIGNING, rights=REFERENCE)
BOB = Actor(sub="bob@example.com", tenant="tenant-a", roles=())


def _decide(state: ApprovalState, call: AuthorizedCall, st: Any, tool: Tool | None) -> Step:
    d = sign_decision(st, SIGNING)
    verified = verify_decision(d, kafka_key=call.call_id, keys=SIGNING, now=NOW)
    return on_decided(state, d, verified, call_id=call.call_id, tool=tool, now=NOW, rules=RULES)


def _committed(step: Step) -> list[CommittedCommand]:
    return [e.value for e in step.emits if isinstance(e.value, CommittedCommand)]


@pytest.mark.parametrize("rights", [REFERENCE, RoleRights()], ids=["reference-set", "built-in"])
def test_a_destructive_call_confirmed_by_its_owner_commits_after_one_confirmation(
    catalog: Catalog, rights: Any
) -> None:
    rules = Rules(keys=SIGNING, rights=rights)
    tool = catalog.get("delete_payment_method")
    call = call_of(
        "delete_payment_method",
        {"payment_method_id": "pm_1"},
        effect=Effect.DESTRUCTIVE,
        owner="bob@example.com",
    )
    opened = on_authorized(None, call, tool=tool, now=NOW, rules=rules)
    assert opened.state is not None and opened.state.required_approvals == 2  # staff: 4 eyes
    d = sign_decision(statement(call, BOB, kind=DecisionKind.CONFIRMATION), SIGNING)
    verified = verify_decision(d, kafka_key=call.call_id, keys=SIGNING, now=NOW)
    step = on_decided(
        opened.state, d, verified, call_id=call.call_id, tool=tool, now=NOW, rules=rules
    )
    (command,) = _committed(step)
    assert command.approval is not None
    assert command.approval.basis == "confirmation"
    assert command.approval.approvers == ("bob@example.com",)
    # Staff still need two distinct approvers.
    staff = on_decided(
        opened.state,
        sign_decision(statement(call, BOSS), SIGNING),
        verify_decision(
            sign_decision(statement(call, BOSS), SIGNING),
            kafka_key=call.call_id,
            keys=SIGNING,
            now=NOW,
        ),
        call_id=call.call_id,
        tool=tool,
        now=NOW,
        rules=rules,
    )
    assert _committed(staff) == []


# -- texts that name the right actor ----------------------------------------------------------


def _outcome(step: Step) -> Outcome:
    (found,) = [e.value for e in step.emits if isinstance(e.value, Outcome)]
    return found


def test_a_call_waiting_for_its_owner_says_so(catalog: Catalog) -> None:
    tool = catalog.get("propose_refund")
    arguments = {"payment_id": "pay_A1001", "amount_minor": 900, "reason": "r"}
    owned = call_of("propose_refund", arguments, effect=Effect.EXTERNAL_WRITE, owner="bob@x.com")
    waiting = _outcome(on_authorized(None, owned, tool=tool, now=NOW, rules=RULES))
    assert waiting.status is Status.AWAITING_APPROVAL
    assert waiting.error is not None
    assert waiting.error.code is ErrorCode.APPROVAL_REQUIRED
    assert waiting.error.message == AWAITING_CONFIRMATION_MESSAGE
    assert json.loads(result_text(waiting))["message"] == "pending the customer's confirmation"
    # Nobody to confirm: a human approves.
    unowned = call_of("propose_refund", arguments, effect=Effect.EXTERNAL_WRITE)
    staff = _outcome(on_authorized(None, unowned, tool=tool, now=NOW, rules=RULES))
    assert staff.error is not None
    assert staff.error.message == SAFE_MESSAGES[ErrorCode.APPROVAL_REQUIRED]
    assert json.loads(result_text(staff))["message"] == "pending human approval"


def test_a_customers_no_says_the_customer_declined(catalog: Catalog) -> None:
    tool = catalog.get("propose_refund")
    arguments = {"payment_id": "pay_A1001", "amount_minor": 900, "reason": "r"}
    call = call_of(
        "propose_refund", arguments, effect=Effect.EXTERNAL_WRITE, owner="bob@example.com"
    )
    opened = on_authorized(None, call, tool=tool, now=NOW, rules=RULES)
    assert opened.state is not None
    no = statement(call, BOB, verdict=ApprovalVerdict.REJECT, kind=DecisionKind.CONFIRMATION)
    declined = _outcome(_decide(opened.state, call, no, tool))
    assert declined.error is not None
    assert declined.error.code is ErrorCode.APPROVAL_REJECTED
    assert declined.error.message == CUSTOMER_DECLINED_MESSAGE
    staff_no = statement(call, BOSS, verdict=ApprovalVerdict.REJECT, reason="duplicate")
    rejected = _outcome(_decide(opened.state, call, staff_no, tool))
    assert rejected.error is not None
    assert rejected.error.message == "The approver rejected this action. Reason: duplicate"


# -- policy check and policy schema cover approver policies -----------------------------------

TYPO = """// A typo on the fourth line of the second policy.
@id("leads-close-cases")
permit (principal, action in [Action::"approve", Action::"reject"], resource)
when { principal.roles.contains("support_lead") };

@id("bad-lead")
@approvers("two")
permit (principal, action == Action::"open", resource)
when {
  resource.efect == "destructive"
};
"""


def test_policy_check_reports_an_approver_policy_error_at_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "approvers"
    folder.mkdir()
    (folder / "cases.cedar").write_text(TYPO, encoding="utf-8")
    # A catalog's folder is checked with the reference set: an @id of that set repeated.
    (folder / "copy.cedar").write_text(
        '@id("approver-role-own-tenant")\npermit (principal, action, resource);\n',
        encoding="utf-8",
    )
    problems = check_approver_policies(
        approver_policy_sources(Catalog([_tool("close_case")], approver_policies=folder))
    )
    found = {(Path(p.file).name, p.line): p.message for p in problems}
    assert len(problems) == 3, problems
    assert "attribute `efect`" in found[("cases.cedar", 10)]
    assert "@approvers('two') is not a positive integer" in found[("cases.cedar", 7)]
    assert "also at" in found[("copy.cedar", 1)]
    # Through the command: the helpdesk's own folder passes; a candidate folder does not.
    monkeypatch.setenv("RATIFIER_CATALOG", "examples.helpdesk:catalog")
    helpdesk_policies = str(HELPDESK_APPROVERS.parent)
    assert main(["policy", "check", "--policies", helpdesk_policies]) == 0
    assert "helpdesk/policies/approvers" in capsys.readouterr().out
    argv = ["policy", "check", "--policies", helpdesk_policies, "--approver-policies", str(folder)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert f"{folder / 'cases.cedar'}:10: " in out
    assert "2 problem(s)" in out


def test_a_stale_copy_of_the_approver_schema_is_reported(tmp_path: Path) -> None:
    (tmp_path / "cases.cedar").write_text(ONLY_LEADS, encoding="utf-8")
    schema = json.loads(APPROVER_SCHEMA.read_text(encoding="utf-8"))
    del schema[""]["entityTypes"]["PendingCall"]["shape"]["attributes"]["owner"]
    (tmp_path / "approvers.cedarschema.json").write_text(json.dumps(schema), encoding="utf-8")
    (problem,) = check_approver_policies(approver_policy_sources(None, tmp_path))
    assert "differs from ratifier's approver schema" in problem.message


def test_policy_schema_prints_the_approver_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "schema", "--approvers"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        APPROVER_SCHEMA.read_text(encoding="utf-8")
    )
