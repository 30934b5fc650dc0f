"""Approver notifications, the pure parts: signatures, payload, delivery ids, endpoints,
retry schedule and dead-letter bound (approvals/notify.py)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from approvals.notifier import Notifier
from approvals.notify import (
    DEFAULT_TOLERANCE_SECONDS,
    Directory,
    Endpoint,
    RetryPolicy,
    after_failure,
    deliveries_for,
    load_directory,
    parse_endpoints,
    resolve_secrets,
    short_error,
    sign,
    signature_problem,
    verify_signature,
)
from audit.story import record_event
from config.settings import Settings
from schemas.envelopes import ApprovalRequest, DecisionKind, Effect, NotificationDeadLetter
from schemas.errors import ConfigurationError

SECRET = b"whsec-test-0123456789abcdef"
NOW = 1_790_000_000
CONTEXT_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0.c2lnbmF0dXJl"


def request(subject: str | None = None, **changes: object) -> ApprovalRequest:
    fields: dict[str, object] = {
        "call_id": "call-notify-1",
        "operation_id": "op-1",
        "tenant": "tenant-a",
        "tool": "propose_refund",
        # Arguments may hold anything an agent sent, a credential included: never forwarded.
        "arguments": {"payment_id": "pay_A1001", "amount_minor": 500, "note": CONTEXT_TOKEN},
        "preview": ("Refund 5.00 EUR of pay_A1001",),
        "fingerprint": "f" * 64,
        "effect": Effect.EXTERNAL_WRITE,
        "policy_version": "pv-1",
        "requested_by": "agent-7",
        "expires_at": datetime(2026, 12, 2, 9, 0, tzinfo=UTC),
        "subject": subject,
        "required_approvals": 2,
    }
    return ApprovalRequest.model_validate(fields | changes)


def endpoint(name: str, *kinds: DecisionKind, tenant: str = "tenant-a") -> Endpoint:
    return Endpoint(
        tenant=tenant,
        name=name,
        url=f"https://hooks.example/{name}",
        secret=SECRET,
        kinds=frozenset(kinds or (DecisionKind.APPROVER,)),
    )


DIRECTORY = Directory(
    {
        "tenant-a": (
            endpoint("ops"),
            endpoint("customers", DecisionKind.CONFIRMATION),
        ),
        "tenant-b": (endpoint("ops", tenant="tenant-b"),),
    }
)


# -- signatures -----------------------------------------------------------------------------


def test_a_signature_verifies_for_its_body_and_secret() -> None:
    body = b'{"call_id":"c-1"}'
    header = sign(SECRET, body, NOW)
    assert header.startswith(f"t={NOW},v1=")
    assert verify_signature(SECRET, header, body, NOW + 10)
    assert verify_signature(SECRET.decode(), header, body, NOW - 10)


def test_a_tampered_body_is_refused() -> None:
    header = sign(SECRET, b'{"amount_minor":500}', NOW)
    assert not verify_signature(SECRET, header, b'{"amount_minor":50000}', NOW)
    assert signature_problem(SECRET, header, b'{"amount_minor":5}', now=NOW) == (
        "signature mismatch"
    )


def test_a_wrong_secret_is_refused() -> None:
    body = b"{}"
    assert not verify_signature(b"another-secret", sign(SECRET, body, NOW), body, NOW)


def test_a_signature_outside_the_replay_window_is_refused() -> None:
    body = b"{}"
    header = sign(SECRET, body, NOW)
    late = NOW + DEFAULT_TOLERANCE_SECONDS + 1
    assert not verify_signature(SECRET, header, body, late)
    assert signature_problem(SECRET, header, body, now=late) == (
        "timestamp outside the replay window"
    )
    # a timestamp from the future is as suspect as one from the past
    assert not verify_signature(SECRET, header, body, NOW - 61, tolerance=60)
    assert verify_signature(SECRET, header, body, NOW + 59, tolerance=60)


def test_the_timestamp_is_signed_too() -> None:
    body = b"{}"
    forged = sign(SECRET, body, NOW).replace(f"t={NOW}", f"t={NOW + 1000}")
    assert signature_problem(SECRET, forged, body, now=NOW + 1000) == "signature mismatch"


@pytest.mark.parametrize("header", [None, "", "v1=abc", f"t={NOW}", "t=soon,v1=abc"])
def test_malformed_signature_headers_are_refused(header: str | None) -> None:
    assert not verify_signature(SECRET, header, b"{}", NOW)


def test_one_matching_entry_of_several_verifies_during_a_rotation() -> None:
    body = b"{}"
    old = sign(b"old-secret", body, NOW).split(",")[1]
    header = f"{sign(SECRET, body, NOW)},{old}"
    assert verify_signature(SECRET, header, body, NOW)
    assert verify_signature(b"old-secret", header, body, NOW)


# -- payload and delivery ids -------------------------------------------------------------


def test_the_payload_carries_what_a_human_decides_on_and_no_credential() -> None:
    (delivery,) = deliveries_for(request(), DIRECTORY, dashboard_url="https://ratifier.example/")
    body = json.loads(delivery.body)
    assert body == {
        "type": "approval.requested",
        "delivery_id": delivery.delivery_id,
        "kind": "approver",
        "call_id": "call-notify-1",
        "tenant": "tenant-a",
        "tool": "propose_refund",
        "effect": "external_write",
        "preview": ["Refund 5.00 EUR of pay_A1001"],
        "expires_at": "2026-12-02T09:00:00+00:00",
        "required_approvals": 2,
        "subject": None,
        "decide_url": "https://ratifier.example/?call=call-notify-1",
    }
    raw = delivery.body.decode()
    assert CONTEXT_TOKEN not in raw and "arguments" not in raw
    assert SECRET.decode() not in raw and "eyJ" not in raw


def test_a_request_naming_a_subject_also_goes_to_confirmation_endpoints() -> None:
    deliveries = deliveries_for(request("cust-42"), DIRECTORY, dashboard_url="http://d/")
    by_endpoint = {d.endpoint: d for d in deliveries}
    assert set(by_endpoint) == {"ops", "customers"}
    confirmation = json.loads(by_endpoint["customers"].body)
    assert confirmation["kind"] == "confirmation"
    assert confirmation["type"] == "confirmation.requested"
    assert confirmation["subject"] == "cust-42"
    # without a subject, nobody is asked to confirm
    assert [
        d.endpoint for d in deliveries_for(request(), DIRECTORY, dashboard_url="http://d/")
    ] == ["ops"]


def test_delivery_ids_are_stable_per_request_endpoint_and_kind() -> None:
    first = deliveries_for(request("cust-42"), DIRECTORY, dashboard_url="http://d/")
    again = deliveries_for(request("cust-42"), DIRECTORY, dashboard_url="http://d/")
    assert [d.delivery_id for d in first] == [d.delivery_id for d in again]
    assert len({d.delivery_id for d in first}) == len(first) == 2
    other_tenant = deliveries_for(request(tenant="tenant-b"), DIRECTORY, dashboard_url="http://d/")
    assert other_tenant[0].delivery_id not in {d.delivery_id for d in first}
    edited = deliveries_for(request("cust-42", fingerprint="e" * 64), DIRECTORY, dashboard_url="x")
    assert {d.delivery_id for d in edited}.isdisjoint(d.delivery_id for d in first)
    assert all(json.loads(d.body)["delivery_id"] == d.delivery_id for d in first)


def test_a_tenant_without_endpoints_owes_nothing() -> None:
    assert deliveries_for(request(tenant="tenant-z"), DIRECTORY, dashboard_url="http://d/") == []


# -- endpoints file -------------------------------------------------------------------------


def test_endpoints_are_read_from_json_with_secrets_from_env_and_files(tmp_path: Path) -> None:
    (tmp_path / "b.secret").write_text("secret-of-b\n")
    path = tmp_path / "endpoints.json"
    path.write_text(
        json.dumps(
            {
                "tenants": {
                    "tenant-a": [
                        {"name": "ops", "url": "https://a.example/h", "secret_env": "A_SECRET"}
                    ],
                    "tenant-b": [
                        {
                            "name": "cust",
                            "url": "http://127.0.0.1:9/h",
                            "secret_file": "b.secret",
                            "kinds": ["approver", "confirmation"],
                        }
                    ],
                }
            }
        )
    )
    directory = load_directory(str(path), {"A_SECRET": "secret-of-a"})
    a = directory.endpoint("tenant-a", "ops")
    b = directory.endpoint("tenant-b", "cust")
    assert a is not None and a.secret == b"secret-of-a" and a.kinds == {DecisionKind.APPROVER}
    assert b is not None and b.secret == b"secret-of-b" and len(b.kinds) == 2
    assert "secret-of" not in repr(a) + repr(directory)
    assert directory.tenants == ("tenant-a", "tenant-b")


def test_endpoints_are_read_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.toml"
    path.write_text(
        '[[tenants.tenant-a]]\nname = "ops"\nurl = "https://a.example/h"\nsecret_env = "S"\n'
    )
    directory = load_directory(str(path), {"S": "s3cret"})
    assert [e.name for e in directory.by_tenant["tenant-a"]] == ["ops"]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "x", "url": "https://h/"}, "exactly one of secret_env and secret_file"),
        ({"name": "x", "url": "https://h/", "secret_env": "S", "secret": "inline"}, "secret"),
        ({"name": "x", "url": "ftp://h/", "secret_env": "S"}, "url"),
        ({"name": "x", "url": "https://h/", "secret_env": "S", "kinds": ["boss"]}, "kinds"),
    ],
)
def test_bad_endpoint_declarations_are_configuration_errors(
    entry: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        parse_endpoints(json.dumps({"tenants": {"tenant-a": [entry]}}))


def test_duplicate_endpoint_names_and_missing_secrets_are_refused() -> None:
    ep = {"name": "x", "url": "https://h/", "secret_env": "S"}
    with pytest.raises(ConfigurationError, match="unique"):
        parse_endpoints(json.dumps({"tenants": {"tenant-a": [ep, ep]}}))
    declared = parse_endpoints(json.dumps({"tenants": {"tenant-a": [ep]}}))
    with pytest.raises(ConfigurationError, match=r"\$S is not set"):
        resolve_secrets(declared, environ={})


# -- retries and the dead-letter bound -------------------------------------------------------


POLICY = RetryPolicy(
    backoff_seconds=2.0, backoff_cap_seconds=60.0, max_attempts=8, max_age_seconds=3600
)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert POLICY.schedule() == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert POLICY.backoff(1000) == 60.0


def test_a_failure_within_the_bound_is_retried_after_the_backoff() -> None:
    queued = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    now = queued + timedelta(seconds=10)
    decided = after_failure(POLICY, attempts=3, queued_at=queued, now=now)
    assert not decided.dead and decided.retry_at == now + timedelta(seconds=8)


def test_a_delivery_is_dead_after_its_attempts() -> None:
    queued = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    assert after_failure(POLICY, attempts=7, queued_at=queued, now=queued).dead is False
    decided = after_failure(POLICY, attempts=8, queued_at=queued, now=queued)
    assert decided.dead and decided.retry_at is None


def test_a_delivery_is_dead_when_its_next_attempt_would_pass_the_age_bound() -> None:
    queued = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    near_end = queued + timedelta(seconds=3600 - 3)
    assert after_failure(POLICY, attempts=2, queued_at=queued, now=near_end).dead
    earlier = near_end - timedelta(seconds=10)
    assert after_failure(POLICY, attempts=2, queued_at=queued, now=earlier).dead is False


def test_the_dead_letter_names_the_endpoint_never_its_url_or_secret() -> None:
    fields = set(NotificationDeadLetter.model_fields)
    assert {"delivery_id", "call_id", "tenant", "endpoint", "attempts", "last_error"} <= fields
    assert not fields & {"url", "secret", "body", "headers", "signature"}


def test_the_receiver_snippet_in_the_docs_verifies_what_the_notifier_signs() -> None:
    text = (Path(__file__).parents[2] / "docs" / "notifications.md").read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(snippet, "docs/notifications.md", "exec"), scope)  # our own doc
    verify = scope["verify"]
    assert callable(verify)
    body = b'{"call_id":"c-1"}'
    now = int(time.time())
    assert verify(SECRET, sign(SECRET, body, now), body) is True
    assert verify(SECRET, sign(SECRET, body, now), body + b" ") is False
    assert verify(b"wrong", sign(SECRET, body, now), body) is False
    assert verify(SECRET, sign(SECRET, body, now - 301), body) is False


async def test_a_record_that_is_not_an_approval_request_is_a_failure_of_its_own() -> None:
    notifier = Notifier(Settings(), DIRECTORY)
    good = request(tenant="tenant-z")  # a tenant without endpoints: nothing to write
    records = [
        SimpleNamespace(value=b"{not json", key=b"x"),
        SimpleNamespace(value=good.to_bytes(), key=b"call-notify-1"),
    ]
    bad, ok = await notifier._enqueue(records)
    assert bad.failure is not None and "not an approval request" in bad.failure
    assert ok.failure is None


def test_a_notification_dead_letter_tells_its_story_in_the_audit() -> None:
    letter = NotificationDeadLetter(
        delivery_id="dlv_0123",
        call_id="call-notify-1",
        tenant="tenant-a",
        endpoint="ops",
        kind=DecisionKind.APPROVER,
        attempts=10,
        last_error="HTTP 500",
        first_queued_at=datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
        at=datetime(2026, 12, 2, 9, 0, tzinfo=UTC),
    )
    event = record_event(
        {
            "stream": "notifications.deadletter",
            "kafka_partition": 0,
            "kafka_offset": 7,
            "record_at": letter.at,
            "record": letter.model_dump(mode="json"),
        }
    )
    assert (event.stage, event.what) == ("notifier", "notification dead-lettered: ops (approver)")
    assert dict(event.facts) == {
        "delivery_id": "dlv_0123",
        "attempts": "10",
        "last_error": "HTTP 500",
    }


def test_a_failure_description_never_carries_the_endpoint_url() -> None:
    url = "https://hooks.example.com/services/T000/B000/XXXXSECRETXXXX?token=abc"
    text = f"InvalidURL: {url}\nor just /services/T000/B000/XXXXSECRETXXXX?token=abc"
    described = short_error(text, url=url, name="ops-chat")
    assert "XXXXSECRETXXXX" not in described and "token=abc" not in described
    assert described == "InvalidURL: <ops-chat> or just <ops-chat>"
    assert len(short_error("x" * 5000)) == 300
