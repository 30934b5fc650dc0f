"""The dashboard in a real browser: sign in as an approver, approve a pending refund from the
inbox, and watch its `succeeded` outcome arrive in the live feed; as an operator, freeze and
unfreeze a scope through the page's confirmation (the audit names the operator); as an
approver without the operator role, see the frozen scopes and what each panel shows.

Playwright (Python) drives Debian's Chromium (`deploy/local/browser` installs it); the pipeline,
the audit sink and `ratifier dashboard` are real processes on their own topic prefix. The
screenshot is written to test-artifacts/dashboard-approval.png.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from commands.budgets import load_budget_file, window_of
from ratifier.topics import delete_topics
from tests.e2e.approvals_kit import REFUND, audit, propose, terminal_outcomes, token
from tests.e2e.conftest import (
    ARTIFACTS,
    Pipeline,
    SigningKeys,
    free_port,
    start_pipeline,
    wait_http,
)
from tests.services import run
from tests.unit.test_budget_context import NEAR_BUDGET, budgeted_directory
from tests.unit.test_budgets import REFUNDS_DAILY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHROMIUM = Path(os.environ.get("RATIFIER_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = ARTIFACTS / "dashboard-approval.png"
SIGN_IN_ABOVE = "Sign in above"

T = TypeVar("T")


def eventually(read: Callable[[], T], done: Callable[[T], bool], *, timeout: float = 30) -> T:
    """``read()`` again (every 0.2 s) until ``done`` holds for what it returns; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        time.sleep(0.2)


def controls_audit(pipeline: Pipeline, scope: str) -> list[dict[str, Any]]:
    """The `controls` records of ``scope`` the audit sink stored, in the topic's order."""
    with psycopg.connect(pipeline.settings.storage.database_url) as conn:
        rows = conn.execute(
            "SELECT record FROM audit_records WHERE prefix = %s AND stream = 'controls'"
            " AND record_key = %s ORDER BY kafka_partition, kafka_offset",
            (pipeline.settings.topic_prefix, scope),
        ).fetchall()
    return [record for (record,) in rows]


def post_freeze(url: str, auth: str, scope: str, *, frozen: bool) -> dict[str, Any]:
    """`POST /api/freezes` as a script would (the page is not involved)."""
    request = urllib.request.Request(
        url + "api/freezes",
        data=json.dumps(
            {"scope": scope, "frozen": frozen, "reason": "set up by the test"}
        ).encode(),
        headers={"Authorization": f"Bearer {auth}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def signed_in(browser: Browser, url: str, auth: str, problems: list[str]) -> Page:
    """A dashboard tab signed in with ``auth``; its page errors are added to ``problems``."""
    page = browser.new_page(viewport={"width": 1440, "height": 1250})
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.goto(url)
    page.fill("#token", auth)
    page.click("#signin button[type=submit]")
    return page


@pytest.fixture(scope="module")
def dashboard(signing_keys: SigningKeys) -> Iterator[tuple[Pipeline, str]]:
    """A pipeline with the audit sink (approval TTL long enough for a browser), and the
    dashboard on a free port reading it."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run deploy/local/browser (make browser)")
    pipeline = start_pipeline(signing_keys, "dashboard", approval_ttl=600, audit_sink=True)
    try:
        port = free_port()
        worker = pipeline.start("dashboard", "dashboard", RATIFIER_DASHBOARD_PORT=str(port))
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, worker)
        yield pipeline, url
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def test_approver_approves_a_refund_and_sees_it_succeed(dashboard: tuple[Pipeline, str]) -> None:
    pipeline, url = dashboard
    # Two refunds wait for a human: one is approved here, the other stays in the inbox.
    first, second = propose(pipeline, n=2)
    boss = token(pipeline.settings, "boss")
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1250})
            page.on("console", console)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(url)
            page.locator("#health[data-state='live']").wait_for(timeout=30_000)

            page.fill("#token", boss)
            page.click("#signin button[type=submit]")
            page.locator("#who").wait_for(state="visible")
            assert page.inner_text("#who-sub") == "boss"
            assert page.inner_text("#who-tenant") == "tenant-a"

            card = page.locator(f"article.req[data-call-id='{first['call_id']}']")
            card.wait_for(timeout=30_000)
            page.locator(f"article.req[data-call-id='{second['call_id']}']").wait_for()
            assert card.locator(".req-tool").inner_text() == "propose_refund"
            preview = card.locator(".preview").inner_text()
            # Amounts as the feed shows them (the payment's currency), not in minor units.
            shown = [
                "amount: 0.10 EUR" if line.startswith("amount_minor: ") else line
                for line in first["preview"]
            ]
            assert all(line in preview for line in shown), preview
            assert "amount_minor" not in preview
            assert "left" in card.locator(".req-left").inner_text()

            # The requester, signed in as an approver in another tab, approves their own
            # refund: the card says why it was refused, and nothing was published.
            own = signed_in(browser, url, token(pipeline.settings, "agent-1"), problems)
            theirs = own.locator(f"article.req[data-call-id='{second['call_id']}']")
            theirs.wait_for(timeout=30_000)
            theirs.locator("button[data-action='approve']").click()
            own.locator(
                f"article.req[data-call-id='{second['call_id']}'][data-verdict='refused']"
            ).wait_for(timeout=30_000)
            assert "self_approval" in theirs.locator(".error").inner_text()
            own.close()

            card.locator("button[data-action='approve']").click()
            # The page follows the decision to the approval-join's verdict.
            page.locator(".toast", has_text="approve applied for propose_refund").wait_for(
                timeout=60_000
            )
            done = page.locator(
                f"#feed tr[data-call-id='{first['call_id']}'][data-status='succeeded']"
            )
            done.wait_for(timeout=60_000)
            assert "approved by boss" in done.inner_text()
            # The approved request leaves the inbox; the other one is still there to decide.
            card.wait_for(state="detached", timeout=15_000)
            assert page.locator("article.req").count() >= 1
            page.locator(
                f"#feed tr[data-call-id='{first['call_id']}'][data-status='decision:approve']"
            ).wait_for(timeout=15_000)
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True, animations="disabled")
        finally:
            browser.close()

    assert problems == [], problems
    outcome = terminal_outcomes(pipeline, {first["call_id"]})[first["call_id"]]
    assert [(o["status"], o["approval"]["approver"]) for o in outcome] == [("succeeded", "boss")]
    assert outcome[0]["result"]["amount_minor"] == REFUND["amount_minor"]
    assert SCREENSHOT.stat().st_size > 10_000
    # The dashboard's own /metrics counts the decision it published.
    with urllib.request.urlopen(url + "metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'ratifier_records_total{stage="dashboard",status="decision_approve"} 1.0' in metrics
    # The refused self-approval was never published: the second refund is still undecided.
    assert not any(k.startswith("approval_decision") for k, _ in audit(pipeline, second["call_id"]))


def test_operator_freezes_and_unfreezes_a_scope_from_the_page(
    dashboard: tuple[Pipeline, str],
) -> None:
    """An operator (no approver role) signs in, freezes a scope through the page's
    confirmation, sees it listed and in force, and unfreezes it the same way; a cancelled
    confirmation publishes nothing; the audit names the operator who clicked."""
    pipeline, url = dashboard
    operator = token(pipeline.settings, "ops-1", roles=("operator",))
    scope = f"tool:tenant-a:probe_{uuid.uuid4().hex[:8]}"
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = signed_in(browser, url, operator, problems)
            page.locator("#who").wait_for(state="visible", timeout=30_000)
            assert page.inner_text("#who-sub") == "ops-1"
            assert "operator" in page.inner_text("#who-roles")
            # What each panel tells an operator without the approver role, at once.
            assert page.inner_text("#inbox-access").startswith(
                "Your token has no approver role: approvals are not shown"
            )
            assert page.locator("#inbox[hidden]").count() == 1
            assert page.inner_text("#freezes-access") == (
                "You see the frozen scopes of tenant-a and the fleet-wide ones; you may freeze "
                "and unfreeze tenant-a's scopes (writes:* needs the fleet_operator role)."
            )
            assert SIGN_IN_ABOVE not in page.inner_text("body")

            page.fill("#freeze-scope", scope)
            page.fill("#freeze-reason", "browser test")
            # Cancelled: the dialog names the scope and what it stops; nothing is published.
            page.click("#freeze-form button[type=submit]")
            dialog = page.locator("#confirm[open]")
            dialog.wait_for(timeout=10_000)
            assert page.inner_text("#confirm-title") == f"Freeze {scope}?"
            tool = scope.rsplit(":", 1)[1]
            assert (
                page.inner_text("#confirm-stops")
                == f"This stops every call of tool {tool} in tenant-a."
            )
            assert "frozen by ops-1 (tenant-a)" in page.inner_text("#confirm-effect")
            page.click("#confirm-cancel")
            dialog.wait_for(state="hidden", timeout=10_000)
            cancelled = page.locator("#freeze-result[data-state='cancelled']")
            cancelled.wait_for(timeout=10_000)
            assert "nothing was published" in cancelled.inner_text()

            # Confirmed: published; the page says since when it is in force, and by whom.
            page.click("#freeze-form button[type=submit]")
            dialog.wait_for(timeout=10_000)
            page.click("#confirm-ok")
            result = page.locator("#freeze-result[data-state='published'][data-frozen='true']")
            result.wait_for(timeout=30_000)
            dialog.wait_for(state="hidden", timeout=10_000)
            shown_at = result.get_attribute("data-at")
            assert shown_at and result.get_attribute("data-by") == "ops-1"
            assert "in force since" in result.inner_text()
            assert "by ops-1 (tenant-a)" in result.inner_text()
            row = page.locator(f"#freezes tr[data-scope='{scope}']")
            row.wait_for(timeout=30_000)
            assert "ops-1 (tenant-a)" in row.inner_text() and "browser test" in row.inner_text()
            assert page.inner_text("#freezes-count") == "1"

            # The audit: the record names the operator who clicked, and the time shown.
            (frozen,) = eventually(lambda: controls_audit(pipeline, scope), lambda r: len(r) >= 1)
            assert (frozen["frozen"], frozen["by"], frozen["by_tenant"], frozen["reason"]) == (
                True,
                "ops-1",
                "tenant-a",
                "browser test",
            )
            assert datetime.fromisoformat(frozen["at"]) == datetime.fromisoformat(shown_at)

            row.locator("button[data-action='unfreeze']").click()
            dialog.wait_for(timeout=10_000)
            assert page.inner_text("#confirm-title") == f"Unfreeze {scope}?"
            page.click("#confirm-ok")
            row.wait_for(state="detached", timeout=30_000)
            page.locator("#freeze-result[data-frozen='false']").wait_for(timeout=10_000)
            assert "Nothing is frozen." in page.inner_text("#freezes")
            shot = ARTIFACTS / "dashboard-kill-switch.png"
            page.locator("#freezes-card").screenshot(path=str(shot))
        finally:
            browser.close()
    assert problems == [], problems
    # One freeze and one unfreeze, both by ops-1: the cancelled confirmation published
    # nothing (same scope, same key and partition, so it would be listed first).
    records = eventually(lambda: controls_audit(pipeline, scope), lambda r: len(r) >= 2)
    assert [(r["frozen"], r["by"], r["by_tenant"]) for r in records] == [
        (True, "ops-1", "tenant-a"),
        (False, "ops-1", "tenant-a"),
    ]


def test_an_approver_sees_the_frozen_scopes_and_what_each_panel_shows(
    dashboard: tuple[Pipeline, str],
) -> None:
    """An approver without the operator role: the inbox; the frozen scopes with no way to
    freeze or unfreeze (the panel says it needs the operator role); what the budgets and
    limits panels show. Signed out, the panels ask to sign in."""
    pipeline, url = dashboard
    scope = f"tool:tenant-a:probe_{uuid.uuid4().hex[:8]}"
    operator = token(pipeline.settings, "ops-2", roles=("operator",))
    post_freeze(url, operator, scope, frozen=True)
    problems: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = signed_in(browser, url, token(pipeline.settings, "boss"), problems)
                page.locator("#who").wait_for(state="visible", timeout=30_000)
                page.locator("#inbox").wait_for(state="visible", timeout=10_000)
                assert page.locator("#inbox-access").is_hidden()
                assert page.inner_text("#freezes-access") == (
                    "You see the frozen scopes of tenant-a and the fleet-wide ones; "
                    "freezing needs the operator role."
                )
                row = page.locator(f"#freezes tr[data-scope='{scope}']")
                row.wait_for(timeout=30_000)
                assert "ops-2 (tenant-a)" in row.inner_text()
                assert row.locator("button").count() == 0
                assert "operator only" in row.inner_text()
                assert page.locator("#freeze-form").is_hidden()
                assert page.inner_text("#budgets-access").startswith(
                    "You see the budgets of the policy set in force and tenant-a's usage"
                )
                assert page.inner_text("#limits-access").startswith(
                    "You see the admission limits that apply to tenant-a"
                )
                assert SIGN_IN_ABOVE not in page.inner_text("body")
                page.locator("#freezes-card").screenshot(
                    path=str(ARTIFACTS / "dashboard-kill-switch-approver.png")
                )
                # Signed out: every signed-in panel asks to sign in again, nothing else.
                page.click("#signout")
                page.locator("#freezes-signin").wait_for(state="visible", timeout=10_000)
                for panel in ("freezes", "budgets", "limits"):
                    assert page.inner_text(f"#{panel}-signin").startswith(SIGN_IN_ABOVE)
                    assert page.locator(f"#{panel}-panel").is_hidden()
                assert page.locator("#inbox[hidden]").count() == 1
            finally:
                browser.close()
    finally:
        post_freeze(url, operator, scope, frozen=False)
    assert problems == [], problems


def test_the_budgets_panel_shows_usage_reserved_cap_and_reset(
    dashboard: tuple[Pipeline, str], tmp_path: Path
) -> None:
    """The budgets panel: a dashboard whose policy set declares a daily refund budget shows
    the signed-in tenant's usage of it (rows as the executor writes them) with a bar."""
    pipeline, _ = dashboard
    name = f"refunds-{uuid.uuid4().hex[:10]}"  # the test database outlives sessions
    directory = budgeted_directory(
        tmp_path,
        NEAR_BUDGET.replace("refunds-daily", name),
        budgets=REFUNDS_DAILY.replace("refunds-daily", name),
    )
    (budget,) = load_budget_file(directory)
    window = window_of(budget, datetime.now(UTC)).key
    with psycopg.connect(pipeline.settings.storage.database_url, autocommit=True) as conn:
        for state, amount in (("consumed", 41_000), ("reserved", 500)):
            conn.execute(
                "INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, "
                "amount, state, reserved_at) VALUES ('tenant-a', %s, %s, 'agent=agent-1', %s, "
                "%s, %s, now())",
                (name, uuid.uuid4().hex, window, amount, state),
            )
    port = free_port()
    worker = pipeline.start(
        "dashboard",
        "dashboard-budgets",
        RATIFIER_DASHBOARD_PORT=str(port),
        RATIFIER_POLICIES__DIRECTORY=str(directory),
    )
    url = f"http://127.0.0.1:{port}/"
    problems: list[str] = []
    try:
        wait_http(url, worker)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = signed_in(browser, url, token(pipeline.settings, "boss"), problems)
                panel = page.locator(f"#budgets [data-budget='{name}']")
                row = panel.locator("tr[data-scope='agent=agent-1']")
                row.wait_for(timeout=30_000)
                text = row.inner_text()
                assert "41500 amount_minor" in text  # used: consumed + reserved
                assert "500" in row.locator(".budget-reserved").inner_text()
                assert "50000" in text and "8500" in text  # cap and what is left
                assert "83 %" in text
                assert row.locator(".budget-fill.warn").count() == 1  # above 80 %
                width = row.locator(".budget-fill").evaluate("el => el.style.width")
                assert width == "83%"
                assert "+01:00" in text or "+02:00" in text  # resets at local midnight
                assert page.inner_text("#budgets-count") == "1"
                shot = ARTIFACTS / "dashboard-budgets.png"
                page.locator("#budgets-card").screenshot(path=str(shot))
            finally:
                browser.close()
    finally:
        pipeline.stop_worker("dashboard-budgets")
    assert problems == [], problems
