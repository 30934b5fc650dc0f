"""The dashboard's JSON API against real PostgreSQL and Kafka: rows as the audit sink writes
them (under this session's topic prefix), the ledger and audit log, and the one write — a
signed decision on `approvals.decided`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from psycopg.types.json import Jsonb

from approvals.signing import VerifiedDecision, approval_keys, verify_decision
from config.settings import Settings
from dashboard.server import create_app
from ratifier.topics import delete_topics, ensure_topics
from runtime.clients import pg_pool
from runtime.identity import context_keys, issue_context_token
from schemas.envelopes import ApprovalDecision
from schemas.names import Topic
from tests.services import read_until, run

pytestmark = pytest.mark.integration


class Rows:
    """Inserts audit_records rows for one prefix, as the sink would."""

    def __init__(self, conn: psycopg.Connection[Any], prefix: str) -> None:
        self.conn = conn
        self.prefix = prefix
        self.offset = 0

    def add(self, stream: str, record: dict[str, Any], at: datetime, **columns: Any) -> None:
        self.offset += 1
        self.conn.execute(
            "INSERT INTO audit_records (topic, kafka_partition, kafka_offset, prefix, stream, "
            "call_id, tenant, tool, status, error_code, record_at, record) VALUES "
            "(%s, 0, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                self.prefix + stream,
                self.offset,
                self.prefix,
                stream,
                record.get("call_id"),
                columns.get("tenant", record.get("tenant")),
                record.get("tool"),
                record.get("status") if stream == "outcomes" else None,
                (record.get("error") or {}).get("code"),
                at,
                Jsonb(record),
            ),
        )


def request_record(call_id: str, tenant: str, expires_at: datetime) -> dict[str, Any]:
    return {
        "v": 1,
        "call_id": call_id,
        "operation_id": f"{tenant}:{call_id}",
        "tenant": tenant,
        "tool": "propose_refund",
        "arguments": {"payment_id": "pay_A1002", "amount_minor": 10, "reason": "late"},
        "preview": ["propose_refund requested by agent-1", "amount_minor: 10"],
        "fingerprint": "a" * 64,
        "effect": "external_write",
        "policy_version": "p1",
        "requested_by": "agent-1",
        "expires_at": expires_at.isoformat(),
    }


def outcome(call_id: str, tenant: str | None, status: str, at: datetime, **extra: Any) -> Any:
    return {
        "v": 1,
        "call_id": call_id,
        "tool": extra.pop("tool", "propose_refund"),
        "tenant": tenant,
        "status": status,
        "stage": "execute",
        "at": at.isoformat(),
        **extra,
    }


@pytest.fixture(scope="module")
def world(own_settings: Settings) -> Iterator[dict[str, Any]]:
    """A deployment's pipeline history in PostgreSQL (the tests only read it); the ledger
    rows are removed after."""
    settings = own_settings
    now = datetime.now(UTC)
    tag = uuid.uuid4().hex[:8]
    ta, tb = f"ta-{tag}", f"tb-{tag}"
    ids = {name: f"{name}-{tag}" for name in ("ok", "deny", "pend", "old", "done", "unk", "rec")}
    with psycopg.connect(settings.storage.database_url, autocommit=True) as conn:
        rows = Rows(conn, settings.topic_prefix)
        t0 = now - timedelta(seconds=30)
        # A read that went all the way through, with timestamps for each stage (contract v1.8:
        # the authorizer committed it, so it has no `calls.authorized` record).
        ok = ids["ok"]
        rows.add("calls.proposed", {"call_id": ok, "tool": "get_payment"}, t0)
        rows.add(
            "calls.validated",
            {"call_id": ok, "tool": "get_payment", "proposed_at": t0.isoformat()},
            t0 + timedelta(milliseconds=20),
            tenant=ta,
        )
        rows.add(
            "commands.committed", {"call_id": ok, "tenant": ta}, t0 + timedelta(milliseconds=50)
        )
        rows.add(
            "outcomes",
            outcome(ok, ta, "succeeded", t0 + timedelta(milliseconds=100), tool="get_payment"),
            t0 + timedelta(milliseconds=100),
        )
        # A denial in another tenant.
        rows.add(
            "outcomes",
            outcome(
                ids["deny"],
                tb,
                "denied",
                now - timedelta(seconds=20),
                error={"code": "policy_denied", "message": "no", "retryable": False},
            ),
            now - timedelta(seconds=20),
        )
        # Approval requests: one pending (with a decision already sent), one expired, one ended.
        sec, minutes = timedelta(seconds=1), timedelta(minutes=1)
        boss = {"token": "masked", "verified": True, "sub": "boss"}
        requested = "approvals.requested"
        rows.add(requested, request_record(ids["pend"], ta, now + 5 * minutes), now - 10 * sec)
        decided = {"call_id": ids["pend"], "decision": "approve", "approver": boss}
        rows.add("approvals.decided", decided, now - 5 * sec)
        rows.add(requested, request_record(ids["old"], ta, now - sec), now - 60 * sec)
        rows.add(requested, request_record(ids["done"], ta, now + 5 * minutes), now - 9 * sec)
        rows.add("outcomes", outcome(ids["done"], ta, "succeeded", now), now - timedelta(seconds=2))
        # Operations: one escalated (unknown), one reconciled; both seen by this deployment.
        for key, status in (("unk", "unknown"), ("rec", "succeeded")):
            call_id = ids[key]
            rows.add("commands.committed", {"call_id": call_id, "tenant": ta}, now)
            conn.execute(
                "INSERT INTO command_ledger (tenant, idempotency_key, operation_id, call_id, tool, "
                "fingerprint, status, reconcile_attempts, escalated_at) "
                "VALUES (%s, %s, %s, %s, 'propose_refund', 'f', %s, %s, %s)",
                (
                    ta,
                    call_id,
                    f"{ta}:{call_id}",
                    call_id,
                    status,
                    8 if key == "unk" else 1,
                    now if key == "unk" else None,
                ),
            )
            conn.execute(
                "INSERT INTO audit_log (tenant, call_id, kind, detail) VALUES (%s, %s, %s, %s)",
                (
                    ta,
                    call_id,
                    "escalated" if key == "unk" else "reconciled",
                    Jsonb(
                        {"attempts": 8} if key == "unk" else {"status": "succeeded", "attempts": 2}
                    ),
                ),
            )
        try:
            yield {"ta": ta, "tb": tb, "ids": ids}
        finally:
            conn.execute("DELETE FROM command_ledger WHERE tenant = %s", (ta,))


def bearer(
    settings: Settings, tenant: str, roles: tuple[str, ...] = ("approver",)
) -> dict[str, str]:
    token = issue_context_token(context_keys(settings), sub="boss", tenant=tenant, roles=roles)
    return {"Authorization": f"Bearer {token}"}


async def test_overview_counts_latency_and_facets(dashboard: Any, world: Any) -> None:
    response = await dashboard.get("/api/overview", params={"window": "900"})
    assert response.status == 200
    body = await response.json()
    kpis = body["kpis"]
    assert kpis["by_status"] == {"succeeded": 2, "denied": 1}
    assert kpis["by_code"] == {"policy_denied": 1}
    assert kpis["pending_approvals"] == 1
    assert (kpis["escalated"], kpis["reconciling"]) == (1, 0)
    assert len(body["series"]) == 30
    assert sum(sum(b["counts"].values()) for b in body["series"]) == 3
    latency = {r["stage"]: r for r in body["latency"]}
    assert latency["validate"]["n"] == 1 and latency["validate"]["p50"] == pytest.approx(20, abs=1)
    assert latency["authorize"]["p95"] == pytest.approx(30, abs=1)  # to its command
    assert latency["approve_commit"]["n"] == 0  # no human, no join: no such span
    assert latency["end_to_end"]["p99"] == pytest.approx(100, abs=1)
    assert set(body["facets"]["tenant"]) == {world["ta"], world["tb"]}
    narrowed = await (await dashboard.get("/api/overview", params={"tenant": world["tb"]})).json()
    assert narrowed["kpis"]["by_status"] == {"denied": 1}
    assert narrowed["breakdown"][0]["by_code"] == {"policy_denied": 1}
    bad = await dashboard.get("/api/overview", params={"status": "splendid"})
    assert bad.status == 400
    assert (await bad.json())["error"]["code"] == "invalid_arguments"


async def test_feed_filters_and_shows_decisions(dashboard: Any, world: Any) -> None:
    items = (await (await dashboard.get("/api/feed")).json())["items"]
    statuses = [(i["call_id"], i["status"]) for i in items]
    ids = world["ids"]
    assert (ids["pend"], "decision:approve") in statuses
    decision = next(i for i in items if i["call_id"] == ids["pend"])
    assert (decision["tenant"], decision["tool"], decision["approver"]) == (
        world["ta"],
        "propose_refund",
        "boss",
    )
    denied = (
        await (await dashboard.get("/api/feed", params={"error_code": "policy_denied"})).json()
    )["items"]
    assert [(i["call_id"], i["tenant"]) for i in denied] == [(ids["deny"], world["tb"])]


async def test_operations_with_history(dashboard: Any, world: Any) -> None:
    items = (await (await dashboard.get("/api/operations", params={"tenant": world["ta"]})).json())[
        "items"
    ]
    assert [(i["call_id"], i["state"]) for i in items] == [
        (world["ids"]["unk"], "escalated"),
        (world["ids"]["rec"], "settled"),
    ]
    assert items[0]["history"][0]["kind"] == "escalated"
    assert items[1]["history"][0]["summary"] == "succeeded after 2 check(s)"


async def test_inbox_needs_an_approver_of_the_tenant(
    dashboard: Any, world: Any, own_settings: Settings
) -> None:
    assert (await dashboard.get("/api/approvals")).status == 401
    wrong = await dashboard.get("/api/approvals", headers={"Authorization": "Bearer not-a-jwt"})
    assert wrong.status == 401
    clerk = await dashboard.get(
        "/api/approvals", headers=bearer(own_settings, world["ta"], ("support",))
    )
    assert clerk.status == 403
    session = await dashboard.get("/api/session", headers=bearer(own_settings, world["ta"]))
    assert (await session.json())["tenant"] == world["ta"]
    mine = await (
        await dashboard.get("/api/approvals", headers=bearer(own_settings, world["ta"]))
    ).json()
    assert [(p["call_id"], p["decision"]) for p in mine["pending"]] == [
        (world["ids"]["pend"], "approve")
    ]
    assert 200 < mine["pending"][0]["seconds_left"] <= 300
    other = await (
        await dashboard.get("/api/approvals", headers=bearer(own_settings, world["tb"]))
    ).json()
    assert other["pending"] == []


async def test_any_verified_token_signs_in_and_learns_what_it_may_do(
    dashboard: Any, own_settings: Settings
) -> None:
    """`/api/session` answers for every verified token (an operator needs no approver role)
    with what the page may offer it: the inbox (approver role), the kill switch (operator
    policies: own tenant's scopes; `writes:*` for a fleet operator)."""

    async def session(roles: tuple[str, ...]) -> Any:
        response = await dashboard.get("/api/session", headers=bearer(own_settings, "t-s", roles))
        assert response.status == 200, roles
        return await response.json()

    def rights(answer: Any) -> tuple[bool, bool, bool]:
        return answer["can_approve"], answer["can_freeze"], answer["can_freeze_fleet"]

    approver = await session(("approver",))
    assert approver == {
        "sub": "boss",
        "tenant": "t-s",
        "roles": ["approver"],
        "can_approve": True,
        "can_freeze": False,
        "can_freeze_fleet": False,
    }
    assert rights(await session(("operator",))) == (False, True, False)
    assert rights(await session(("approver", "operator"))) == (True, True, False)
    assert rights(await session(("fleet_operator",))) == (False, False, True)
    assert rights(await session(("support",))) == (False, False, False)
    assert (await dashboard.get("/api/session")).status == 401
    forged = {"Authorization": "Bearer not-a-jwt"}
    assert (await dashboard.get("/api/session", headers=forged)).status == 401


async def test_decisions_are_published_signed_and_bound(
    dashboard: Any, world: Any, own_settings: Settings
) -> None:
    ids, headers = world["ids"], bearer(own_settings, world["ta"])

    async def decide(call_id: str, body: Any, with_headers: dict[str, str] = headers) -> Any:
        return await dashboard.post(
            f"/api/approvals/{call_id}/decision", json=body, headers=with_headers
        )

    assert (await decide(ids["old"], {"decision": "approve"})).status == 410
    assert (await decide(ids["done"], {"decision": "approve"})).status == 404
    other_tenant = bearer(own_settings, world["tb"])
    assert (await decide(ids["pend"], {"decision": "approve"}, other_tenant)).status == 404
    assert (await decide(ids["pend"], {"decision": "maybe"})).status == 400
    assert (await decide(ids["pend"], {"decision": "edit"})).status == 400  # no arguments
    edited = {"payment_id": "pay_A1002", "amount_minor": 5, "reason": "partial"}
    response = await decide(
        ids["pend"], {"decision": "edit", "arguments": edited, "reason": "half"}
    )
    assert response.status == 202
    assert (await response.json())["fingerprint"] == "a" * 64

    def published(records: list[Any]) -> bool:
        return any(json.loads(r.value)["call_id"] == ids["pend"] for r in records)

    records = await read_until(own_settings, [Topic.APPROVALS_DECIDED], published, timeout=20)
    (decision,) = [
        ApprovalDecision.model_validate_json(r.value)
        for r in records
        if json.loads(r.value)["call_id"] == ids["pend"]
    ]
    verified = verify_decision(
        decision,
        kafka_key=ids["pend"],
        keys=approval_keys(own_settings),
        now=datetime.now(UTC),
    )
    assert isinstance(verified, VerifiedDecision)
    statement = verified.statement
    assert statement.decision.value == "edit"
    assert statement.arguments == edited
    assert statement.fingerprint == "a" * 64
    assert statement.reason == "half"
    assert statement.approver.sub == "boss"
    # The approver's bearer token is verified by the dashboard and never published.
    assert headers["Authorization"].removeprefix("Bearer ") not in json.dumps(
        [r.value.decode() for r in records]
    )


async def test_reads_cannot_write(settings: Settings) -> None:
    pool = pg_pool(
        settings.storage.database_url, max_size=1, dict_rows=True, autocommit=True, read_only=True
    )
    await pool.open(wait=True, timeout=10)
    try:
        async with pool.connection() as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                await conn.execute(
                    "INSERT INTO audit_log (tenant, call_id, kind) VALUES ('x', 'y', 'z')"
                )
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def answers(settings: Settings) -> Iterator[tuple[Settings, dict[str, Any]]]:
    """A deployment of its own (prefix) with pending requests and the approval-join's audit
    of decisions about them, as the join writes it."""
    own = settings.model_copy(update={"topic_prefix": f"v{uuid.uuid4().hex[:10]}."})
    run(ensure_topics(own))
    now = datetime.now(UTC)
    tag = uuid.uuid4().hex[:8]
    tenant = f"tv-{tag}"
    ids = {name: f"{name}-{tag}" for name in ("one", "four", "done", "eur")}
    later = now + timedelta(minutes=5)
    with psycopg.connect(own.storage.database_url, autocommit=True) as conn:
        rows = Rows(conn, own.topic_prefix)
        # A refund of tenant-a's seeded EUR payment pay_A1002, 10 minor units.
        rows.add("approvals.requested", request_record(ids["eur"], "tenant-a", later), now)
        rows.add("approvals.requested", request_record(ids["one"], tenant, later), now)
        four = {
            **request_record(ids["four"], tenant, later),
            "tool": "delete_payment_method",
            "arguments": {"payment_method_id": "pm_1"},
            "effect": "destructive",
            "required_approvals": 2,
        }
        rows.add("approvals.requested", four, now)
        rows.add("approvals.requested", request_record(ids["done"], tenant, later), now)
        rows.add("outcomes", outcome(ids["done"], tenant, "succeeded", now), now)

        def audited(call_id: str, kind: str, **detail: Any) -> None:
            conn.execute(
                "INSERT INTO audit_log (tenant, call_id, kind, detail) VALUES (%s, %s, %s, %s)",
                (tenant, call_id, kind, Jsonb(detail)),
            )

        # boss's approval of the four-eyes call counted, one of two; an approval refused for
        # self-approval; a decision that decided a call which then succeeded.
        audited(
            ids["four"],
            "approval_decision",
            decision_id=f"d-four-{tag}",
            decision="approve",
            approver="boss",
            approvals=1,
            required_approvals=2,
        )
        audited(
            ids["one"],
            "approval_decision_refused",
            decision_id=f"d-self-{tag}",
            decision="approve",
            approver="agent-1",
            refusal="self_approval",
        )
        audited(
            ids["done"],
            "approval_decision",
            decision_id=f"d-done-{tag}",
            decision="approve",
            approver="boss",
        )
    yield own, {"tenant": tenant, "ids": ids, "tag": tag}
    run(delete_topics(own))


def approver(settings: Settings, tenant: str, sub: str) -> dict[str, str]:
    token = issue_context_token(context_keys(settings), sub=sub, tenant=tenant, roles=("approver",))
    return {"Authorization": f"Bearer {token}"}


async def test_decisions_are_checked_before_publishing_and_their_verdict_followed(
    answers: tuple[Settings, dict[str, Any]],
) -> None:
    own, world = answers
    ids, tenant, tag = world["ids"], world["tenant"], world["tag"]
    boss = approver(own, tenant, "boss")
    async with TestClient(TestServer(create_app(own))) as dashboard:

        async def decide(call_id: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
            response = await dashboard.post(
                f"/api/approvals/{call_id}/decision", json=body, headers=headers
            )
            return response.status, await response.json()

        async def verdict(call_id: str, decision_id: str, headers: dict[str, str]) -> Any:
            response = await dashboard.get(
                f"/api/approvals/{call_id}/decisions/{decision_id}", headers=headers
            )
            assert response.status == 200
            return await response.json()

        # The requester approving their own call: a typed refusal, not "published".
        status, body = await decide(
            ids["one"], {"decision": "approve"}, approver(own, tenant, "agent-1")
        )
        assert (status, body["error"]["code"], body["error"]["refusal"]) == (
            403,
            "policy_denied",
            "self_approval",
        )
        # Arguments on an approve (or a reject) are refused, not ignored.
        for verdict_name in ("approve", "reject"):
            status, body = await decide(
                ids["one"], {"decision": verdict_name, "arguments": {"amount_minor": 1}}, boss
            )
            assert (status, body["error"]["code"]) == (400, "invalid_arguments"), body
            assert body["error"]["refusal"] == "arguments_without_edit"
        # Four-eyes: boss's approval already counts (the join's audit says so).
        status, body = await decide(ids["four"], {"decision": "approve"}, boss)
        assert (status, body["error"]["code"], body["error"]["refusal"]) == (
            409,
            "conflict",
            "same_approver",
        )
        # An edit on a four-eyes call is refused before publishing too.
        status, body = await decide(
            ids["four"], {"decision": "edit", "arguments": {"payment_method_id": "pm_2"}}, boss
        )
        assert (status, body["error"]["refusal"]) == (403, "edit_without_arguments")
        # Another approver may; the answer names the decision and where to follow it.
        status, body = await decide(
            ids["four"], {"decision": "approve"}, approver(own, tenant, "boss-2")
        )
        assert status == 202, body
        assert body["follow"] == f"/api/approvals/{ids['four']}/decisions/{body['decision_id']}"
        assert (await verdict(ids["four"], body["decision_id"], boss))["status"] == "published"

        def published_for(records: list[Any]) -> list[Any]:
            return [json.loads(r.value) for r in records]

        records = await read_until(
            own, [Topic.APPROVALS_DECIDED], lambda recs: len(recs) >= 1, timeout=20
        )
        # Only the one allowed decision was ever published.
        assert [(d["call_id"], d["decided_by"]) for d in published_for(records)] == [
            (ids["four"], "boss-2")
        ]
        # The join's verdicts, as its audit tells them.
        waiting = await verdict(ids["four"], f"d-four-{tag}", boss)
        assert (waiting["status"], waiting["approvals"], waiting["required_approvals"]) == (
            "waiting_for_another_approver",
            1,
            2,
        )
        refused = await verdict(ids["one"], f"d-self-{tag}", boss)
        assert refused["status"] == "refused"
        assert refused["error"]["refusal"] == "self_approval"
        assert refused["error"]["code"] == "policy_denied"
        applied = await verdict(ids["done"], f"d-done-{tag}", boss)
        assert (applied["status"], applied["outcome"]) == ("applied", "succeeded")
        # Another tenant's approver sees nothing of it.
        elsewhere = await verdict(ids["done"], f"d-done-{tag}", approver(own, "tenant-x", "boss"))
        assert (elsewhere["status"], elsewhere["outcome"]) == ("published", None)


async def test_inbox_shows_amounts_like_the_feed(answers: tuple[Settings, dict[str, Any]]) -> None:
    own, world = answers
    async with TestClient(TestServer(create_app(own))) as dashboard:
        response = await dashboard.get("/api/approvals", headers=approver(own, "tenant-a", "boss"))
        assert response.status == 200
        (item,) = [
            p for p in (await response.json())["pending"] if p["call_id"] == world["ids"]["eur"]
        ]
    # The payment's currency (its loader's fact), by the feed's formatter: not "amount_minor: 10".
    assert "amount: 0.10 EUR" in item["preview"]
    assert not any(line.startswith("amount_minor") for line in item["preview"])


async def test_budgets_show_the_tenants_usage_of_the_set_in_force(
    own_settings: Settings, tmp_path: Any
) -> None:
    from commands.budgets import load_budget_file, window_of
    from tests.unit.test_budget_context import budgeted_directory
    from tests.unit.test_budgets import REFUNDS_DAILY

    name = f"refunds-{uuid.uuid4().hex[:10]}"  # the test database outlives sessions
    directory = budgeted_directory(
        tmp_path, "", budgets=REFUNDS_DAILY.replace("refunds-daily", name)
    )
    (directory / "budgets.cedar").unlink()
    (budget,) = load_budget_file(directory)
    settings = own_settings.model_copy(
        update={"policies": own_settings.policies.model_copy(update={"directory": str(directory)})}
    )
    tenant, other = f"ta-{uuid.uuid4().hex[:8]}", f"tb-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    window = window_of(budget, now).key
    with psycopg.connect(settings.storage.database_url, autocommit=True) as conn:
        for owner, state, amount in (
            (tenant, "consumed", 30_000),
            (tenant, "reserved", 700),
            (tenant, "released", 5_000),  # does not count
            (other, "consumed", 1_000),  # another tenant's
        ):
            conn.execute(
                "INSERT INTO budget_usage (tenant, budget, operation_id, scope_key, window_key, "
                "amount, state, reserved_at) VALUES (%s, %s, %s, 'agent=bot-1', %s, %s, %s, %s)",
                (owner, name, uuid.uuid4().hex, window, amount, state, now),
            )
    async with TestClient(TestServer(create_app(settings))) as dashboard:
        assert (await dashboard.get("/api/budgets")).status == 401
        answer = await dashboard.get("/api/budgets", headers=bearer(settings, tenant, ("support",)))
        assert answer.status == 200
        body = await answer.json()
    assert body["tenant"] == tenant
    (shown,) = body["budgets"]
    assert (shown["name"], shown["cap"], shown["unit"]) == (name, 50_000, "amount_minor")
    assert shown["window_key"] == window
    (scope,) = shown["scopes"]
    assert scope == {
        "scope": "agent=bot-1",
        "used": 30_700,
        "consumed": 30_000,
        "reserved": 700,
        "left": 19_300,
        "percent_used": 61,
        "resets_at": scope["resets_at"],
    }
    assert scope["resets_at"].endswith(("+01:00", "+02:00"))  # in Europe/Berlin
