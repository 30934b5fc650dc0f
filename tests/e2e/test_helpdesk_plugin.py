"""The helpdesk example as an out-of-tree plugin: copied outside the repository under another
package name, with its own policies and migrations, run by real worker processes. Its
refusals explain themselves: a forbid's message, foreign = missing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.approvals_kit import decide, terminal_outcomes, token
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import context_token, outcomes_by_call, proposal, publish, read_until, run

pytestmark = pytest.mark.e2e

HELPDESK = Path(__file__).resolve().parents[2] / "examples" / "helpdesk"


@pytest.fixture(scope="module")
def helpdesk(
    signing_keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    plugins = tmp_path_factory.mktemp("plugins")
    shutil.copytree(
        HELPDESK,
        plugins / "helpdesk_plugin",
        ignore=shutil.ignore_patterns("test_*", "__pycache__"),
    )
    started = start_pipeline(
        signing_keys,
        "helpdesk",
        PYTHONPATH=str(plugins),
        RATIFIER_CATALOG="helpdesk_plugin:catalog",
        RATIFIER_POLICIES__DIRECTORY=str(plugins / "helpdesk_plugin" / "policies"),
    )
    try:
        yield started
    finally:
        started.stop()
        run(delete_topics(started.settings))


def ask(pipeline: Pipeline, calls: list[tuple[str, str, tuple[str, ...]]]) -> list[dict[str, Any]]:
    """(ticket id, sub, roles) → each call's terminal outcome, in order."""
    settings = pipeline.settings
    bodies = []
    for ticket_id, sub, roles in calls:
        body = proposal(settings, tool="get_ticket", arguments={"ticket_id": ticket_id})
        body["context"] = context_token(settings, sub=sub, roles=roles)
        bodies.append(body)
    run(publish(settings, [(b["call_id"], json.dumps(b).encode()) for b in bodies]))
    ids = [b["call_id"] for b in bodies]
    records = run(
        read_until(
            settings,
            [Topic.OUTCOMES],
            lambda recs: set(ids) <= set(outcomes_by_call(recs)),
            timeout=60,
        )
    )
    found = outcomes_by_call(records)
    return [found[i][-1] for i in ids]


def test_the_plugin_reads_its_own_table_and_explains_its_refusals(helpdesk: Pipeline) -> None:
    own, foreign, missing, closed, agent = ask(
        helpdesk,
        [
            ("tkt_1", "carol", ()),
            ("tkt_2", "carol", ()),
            ("tkt_404", "carol", ()),
            ("tkt_3", "carol", ()),
            ("tkt_2", "sam", ("support",)),
        ],
    )
    assert own["status"] == "succeeded"
    assert own["result"]["subject"] == "Refund please"
    assert agent["status"] == "succeeded"
    # Another customer's ticket answers exactly like a missing one.
    assert foreign["status"] == missing["status"] == "denied"
    assert foreign["error"] == missing["error"]
    assert foreign["error"]["code"] == "not_found"
    # A forbid's message reaches the outcome, with its reason and policy id.
    assert closed["status"] == "denied"
    assert closed["error"]["reason"] == "forbid"
    assert closed["error"]["policies"] == ["closed-ticket-staff-only"]
    assert closed["error"]["message"].startswith("This ticket is closed")


def test_the_plugins_own_approver_rule_lets_a_support_lead_approve_a_reset(
    helpdesk: Pipeline,
) -> None:
    """The catalog ships an approver rule (policies/approvers/): a support lead, who has no
    approver role, approves a password reset, and the reset runs."""
    settings = helpdesk.settings
    body = proposal(
        settings,
        tool="reset_password",
        arguments={"user_email": "dave@example.com", "temporary_password": "Temporary-123456"},
    )
    body["context"] = context_token(settings, sub="sam", roles=("support",))
    call_id = body["call_id"]
    run(publish(settings, [(call_id, json.dumps(body).encode())]))
    records = run(
        read_until(
            settings,
            [Topic.APPROVALS_REQUESTED],
            lambda recs: any(json.loads(r.value)["call_id"] == call_id for r in recs),
            timeout=60,
        )
    )
    (request,) = [json.loads(r.value) for r in records if json.loads(r.value)["call_id"] == call_id]
    lead = token(settings, "lena", roles=("support_lead",))
    decide(helpdesk, request, lead)
    (final,) = terminal_outcomes(helpdesk, {call_id}, timeout=60)[call_id][-1:]
    assert final["status"] == "succeeded", final
    assert final["result"] == {"reset": True}
