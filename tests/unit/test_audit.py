"""The audit log's pure parts: masking, one record → one row, and a call's story."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.masking import Masker
from audit.records import AuditRow, KafkaRecord, audit_row
from audit.story import _LOG_EVENTS, build_story, render
from commands.catalog import Catalog
from commands.reference import catalog as reference_catalog
from runtime.identity import ContextKeys, issue_context_token, verify_context_token
from schemas.envelopes import Actor
from schemas.errors import Unauthenticated
from schemas.names import TRACEPARENT_HEADER, Topic
from schemas.vocabulary import AuditKind
from tests.unit.conftest import KEYS, NOW

SALT = "unit-salt"
SECRET = "DE89370400440532013000"
PREFIX = "ratifier."
ACCOUNT = {"payment_id": "pay_A1001", "account_holder": "Alice", "account_number": SECRET}


def _verify(token: str) -> Actor | None:
    try:
        return verify_context_token(token, KEYS, check_expiry=False)
    except Unauthenticated:
        return None


MASKER = Masker.for_catalog(reference_catalog, salt=SALT, verify=_verify)
TOKEN = issue_context_token(KEYS, sub="agent-1", tenant="tenant-a", roles=("refund",))


def _row(topic: Topic, body: Any, *, raw: bytes | None = None, **extra: Any) -> AuditRow:
    value = raw if raw is not None else json.dumps(body).encode()
    record = KafkaRecord(
        topic=PREFIX + topic.value,
        partition=1,
        offset=7,
        timestamp_ms=int(NOW.timestamp() * 1000),
        key=b"k",
        value=value,
        **extra,
    )
    return audit_row(record, prefix=PREFIX, masker=MASKER, max_bytes=64 * 1024)


def _stored(row: AuditRow) -> dict[str, Any]:
    body = json.loads(row.record)
    assert isinstance(body, dict)
    return body


# -- masking ------------------------------------------------------------------------------


def test_secret_field_is_the_catalogs_salted_hash(catalog: Catalog) -> None:
    tool = catalog.get("add_payout_account")
    assert tool is not None and tool.secret_fields == {"account_number"}
    masked = MASKER.mask({"arguments": ACCOUNT})
    # The same hash the catalog gives, so records can be matched without the value.
    assert masked["arguments"] == tool.masked(ACCOUNT, salt=SALT)
    assert masked["arguments"]["account_number"].startswith("sha256:")
    assert masked["arguments"]["payment_id"] == "pay_A1001"
    assert SECRET not in json.dumps(masked)


def test_secret_names_match_without_case_or_separators() -> None:
    masked = MASKER.mask({"x": [{"Account-Number": SECRET}, {"ACCOUNTNUMBER": SECRET}]})
    assert SECRET not in json.dumps(masked)


def test_provider_call_with_arguments_as_a_json_string_is_masked_inside() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "add_payout_account", "arguments": json.dumps(ACCOUNT)},
    }
    masked = MASKER.mask({"format": "openai", "call": call})
    inner = masked["call"]["function"]["arguments"]
    assert isinstance(inner, str)
    assert json.loads(inner)["account_number"].startswith("sha256:")
    assert SECRET not in json.dumps(masked)


def test_broken_json_string_mentioning_a_secret_is_hashed_whole() -> None:
    broken = '{"account_number": "' + SECRET + '", '
    masked = MASKER.mask({"arguments": broken})
    assert masked["arguments"].startswith("sha256:")
    # Ordinary text is left alone, even mentioning the field.
    assert MASKER.mask({"reason": "no account_number given"}) == {
        "reason": "no account_number given"
    }


def test_already_masked_and_null_secrets_stay_as_they_are() -> None:
    assert MASKER.mask({"account_number": "***"}) == {"account_number": "***"}
    assert MASKER.mask({"account_number": None}) == {"account_number": None}


def test_tokens_become_the_identity_they_prove() -> None:
    forged = issue_context_token(
        ContextKeys(
            secret="another-secret-that-is-long-enough!!!!",
            audience="ratifier",
            issuer="ratifier-local",
        ),
        sub="mallory",
        tenant="tenant-b",
    )
    masked = MASKER.mask({"context": TOKEN, "approver": forged})
    assert masked["context"]["verified"] is True
    assert (masked["context"]["sub"], masked["context"]["tenant"]) == ("agent-1", "tenant-a")
    assert masked["context"]["roles"] == ("refund",)
    assert masked["approver"] == {
        "token": "masked",
        "sha256": masked["approver"]["sha256"],
        "verified": False,
    }
    assert TOKEN not in json.dumps(masked, default=list)
    assert forged not in json.dumps(masked, default=list)


# -- one record, one row ------------------------------------------------------------------


def test_proposed_row_is_masked_and_carries_the_verified_tenant() -> None:
    row = _row(
        Topic.PROPOSED,
        {"v": 1, "call_id": "c-1", "tool": "add_payout_account", "arguments": ACCOUNT,
         "context": TOKEN, "proposed_at": NOW.isoformat()},
    )  # fmt: skip
    assert (row.stream, row.call_id, row.tool, row.tenant) == (
        "calls.proposed",
        "c-1",
        "add_payout_account",
        "tenant-a",
    )
    assert row.status is None and row.error_code is None
    assert SECRET not in row.record and TOKEN not in row.record
    assert row.record_at == NOW


def test_outcome_row_has_status_code_and_trace_from_the_header() -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    row = _row(
        Topic.OUTCOMES,
        {"call_id": "c-2", "tool": "get_payment", "tenant": "tenant-a", "status": "denied",
         "error": {"code": "not_found"}},
        headers=((TRACEPARENT_HEADER, f"00-{trace}-b7ad6b7169203331-01".encode()),),
    )  # fmt: skip
    assert (row.tenant, row.status, row.error_code, row.trace_id) == (
        "tenant-a",
        "denied",
        "not_found",
        trace,
    )


def test_dead_letter_keeps_the_raw_payload_only_masked() -> None:
    raw = json.dumps({"call_id": "c-3", "arguments": ACCOUNT, "context": TOKEN}).encode()
    row = _row(
        Topic.DEADLETTER,
        {"call_id": "c-3", "reason": "bad", "raw_base64": base64.b64encode(raw).decode()},
    )
    stored = _stored(row)
    assert "raw_base64" not in stored
    assert stored["raw"]["arguments"]["account_number"].startswith("sha256:")
    assert stored["raw_bytes"] == len(raw)
    assert row.error_code == "malformed"
    assert SECRET not in row.record and TOKEN not in row.record

    garbage = b"\x00\xff account_number=" + SECRET.encode()
    letter = _row(Topic.DEADLETTER, {"raw_base64": base64.b64encode(garbage).decode()})
    assert _stored(letter)["raw"] is None
    assert SECRET not in letter.record


def test_unreadable_input_is_kept_as_hash_and_size() -> None:
    cases = [
        b"\xff\xfe" + SECRET.encode(),  # not UTF-8
        b"[1, 2]",  # JSON, but not an object
        b'{"amount": NaN}',  # not JSON (and jsonb refuses it)
        b'{"call_id": "nul\\u0000"}',  # jsonb refuses NUL characters
        b'{"call_id": "lone \\ud800"}',  # not encodable as UTF-8
        b"[" * 5000,  # nesting beyond any parser
        b'{"pad": "' + b"x" * (65 * 1024) + b'"}',  # larger than the limit
    ]
    for raw in cases:
        row = _row(Topic.PROPOSED, None, raw=raw)
        stored = _stored(row)
        assert stored["unparseable"] is True, raw[:40]
        assert stored["bytes"] == len(raw)
        assert len(stored["sha256"]) == 64
        assert row.call_id is None
    tombstone = audit_row(
        KafkaRecord(topic=PREFIX + "policies", partition=0, offset=0, timestamp_ms=0, key=b"k",
                    value=None),
        prefix=PREFIX, masker=MASKER, max_bytes=1024,
    )  # fmt: skip
    assert _stored(tombstone) == {"unparseable": True, "sha256": _stored(tombstone)["sha256"],
                                  "bytes": 0}  # fmt: skip


def test_policy_sets_are_stored_unmasked() -> None:
    body = {"name": "default", "cedar_schema": {"account_number": {"type": "String"}}}
    assert _stored(_row(Topic.POLICIES, body)) == body


@settings(max_examples=200, deadline=None)
@given(
    raw=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda kids: (
                st.lists(kids, max_size=4)
                | st.dictionaries(st.sampled_from(["account_number", "call_id", "x"]), kids)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps({"call_id": "c", "arguments": v}).encode()),
    ),
    topic=st.sampled_from(list(Topic)),
)
def test_every_input_yields_one_storable_row(raw: bytes, topic: Topic) -> None:
    row = _row(topic, None, raw=raw)
    assert "\\u0000" not in row.record
    row.record.encode("utf-8")
    assert isinstance(json.loads(row.record), dict)


# -- the story ----------------------------------------------------------------------------


def _record(stream: str, seconds: float, record: dict[str, Any], **columns: Any) -> dict[str, Any]:
    return {
        "stream": stream,
        "kafka_partition": 0,
        "kafka_offset": int(seconds * 10),
        "record_at": NOW + timedelta(seconds=seconds),
        "record": record,
        "tenant": columns.get("tenant"),
        "tool": columns.get("tool"),
        "status": columns.get("status"),
    }


def _story_rows() -> dict[str, list[dict[str, Any]]]:
    actor = {"verified": True, "sub": "agent-1", "tenant": "tenant-a", "roles": ["refund"]}
    approver = {"verified": True, "sub": "boss", "tenant": "tenant-a", "roles": ["approver"]}
    receipt = {"approver": "boss", "decided_at": "2026-11-29T12:00:03Z"}
    records = [
        # Deliberately out of order: the story sorts by time.
        _record("outcomes", 6.0, {"status": "succeeded", "stage": "execute",
                                  "resource_id": "re_1", "policy_version": "sha256:pv",
                                  "approval": receipt}, status="succeeded", tenant="tenant-a"),
        _record("calls.proposed", 0.0, {"tool": "propose_refund", "context": actor,
                                        "arguments": {"amount_minor": 10}}, tool="propose_refund",
                tenant="tenant-a"),
        _record("calls.validated", 0.1, {"tool": "propose_refund"}),
        _record("calls.authorized", 0.2, {"actor": {"sub": "agent-1", "roles": ["refund"]},
                                          "tenant": "tenant-a", "route": "approval",
                                          "policy_version": "sha256:pv"}),
        _record("approvals.requested", 0.3, {"requested_by": "agent-1",
                                             "preview": ["a", "b"]}),
        _record("outcomes", 0.3, {"status": "awaiting_approval", "stage": "approve",
                                  "error": {"code": "approval_required"}},
                status="awaiting_approval"),
        _record("approvals.decided", 3.0, {"decision": "approve", "approver": approver}),
        _record("commands.committed", 3.1, {"operation_id": "tenant-a:c", "approval": receipt}),
        _record("calls.proposed", 7.0, {"unparseable": True, "sha256": "ab", "bytes": 3}),
    ]  # fmt: skip
    log = [
        {"id": 2, "at": NOW + timedelta(seconds=5), "tenant": "tenant-a", "kind": "executed",
         "detail": {"status": "succeeded", "approver": "boss", "operation_id": "tenant-a:c"}},
        {"id": 1, "at": NOW + timedelta(seconds=3.05), "tenant": "tenant-a",
         "kind": "approval_decision", "detail": {"decision": "approve", "approver": "boss"}},
        {"id": 3, "at": NOW + timedelta(seconds=8), "tenant": None, "kind": "something_new",
         "detail": {"k": "v"}},
    ]  # fmt: skip
    ledger = [
        {"operation_id": "tenant-a:c", "call_id": "c", "fingerprint": "f" * 64,
         "status": "succeeded", "attempts": 2, "reconcile_attempts": 0,
         "created_at": NOW + timedelta(seconds=4), "updated_at": NOW + timedelta(seconds=5),
         "outcome": None, "effect": {"refund_id": "re_1"}},
    ]  # fmt: skip
    return {"records": records, "log": log, "ledger": ledger}


def test_story_is_in_time_order_with_every_stage() -> None:
    story = build_story("c", **_story_rows())
    whats = [e.what for e in story.events]
    assert whats == [
        "proposed",
        "validated: tool exists, arguments match its schema",
        "authorized: policy permits — needs approval",
        "approval requested",
        "outcome: awaiting_approval (approval_required)",  # same time: pipeline order
        "decision received: approve",
        "decision accepted: approve by boss",
        "command committed for execution",
        "ledger entry claimed: execution starts",
        "executed, recorded in the ledger: succeeded",
        "ledger now: succeeded",
        "outcome: succeeded",
        "unreadable record",
        "something_new",
    ]
    assert (story.tenant, story.tool, story.final) == ("tenant-a", "propose_refund", "succeeded")
    assert story.as_json()["events"][0]["facts"]["actor"].startswith("agent-1 @ tenant-a")


def test_rendered_story_is_aligned_and_names_the_key_facts() -> None:
    text = render(build_story("c", **_story_rows()))
    lines = text.splitlines()
    assert lines[0].startswith("call c   tenant tenant-a   tool propose_refund")
    assert "final outcome: succeeded" in lines[0]
    header = next(line for line in lines if line.startswith("TIME"))
    event_lines = [line for line in lines if line.startswith("2026-")]
    assert len(event_lines) == 14
    column = header.index("WHAT HAPPENED")
    assert all(line[column - 2 : column] == "  " for line in event_lines)
    source = header.index("RECORDED IN")
    assert all(line[source - 2 : source] == "  " and line[source] != " " for line in event_lines)
    assert any(line[source:].startswith("audit_log #") for line in event_lines)
    for fact in (
        "agent-1 @ tenant-a (roles: refund; token verified)",
        "policy_version  sha256:pv",
        "boss @ tenant-a (roles: approver; token verified)",
        "approved by boss",
        "ledger_attempts",
        "resource_id     re_1",
    ):
        assert fact in text, fact


def test_story_of_a_reconciled_call_names_checks_and_the_settled_outcome() -> None:
    records = [
        _record("commands.committed", 0.0, {"operation_id": "tenant-a:r"}, tenant="tenant-a"),
        _record("outcomes", 1.0, {"status": "unknown", "stage": "execute",
                                  "error": {"code": "timeout"}}, status="unknown"),
        _record("commands.unknown", 1.0, {"operation_id": "tenant-a:r"}),
        _record("outcomes", 4.0, {"status": "succeeded", "stage": "reconcile",
                                  "resource_id": "re_9"}, status="succeeded"),
    ]  # fmt: skip
    log = [
        {"id": 9, "at": NOW + timedelta(seconds=3.9), "tenant": "tenant-a", "kind": "reconciled",
         "detail": {"operation_id": "tenant-a:r", "status": "succeeded", "attempts": 2}},
    ]  # fmt: skip
    ledger = [
        {"operation_id": "tenant-a:r", "call_id": "other-call", "fingerprint": "f",
         "status": "succeeded", "attempts": 1, "reconcile_attempts": 2,
         "created_at": NOW + timedelta(seconds=0.5), "updated_at": NOW + timedelta(seconds=3.9),
         "outcome": {"error": None}, "effect": {"refund_id": "re_9"}},
    ]  # fmt: skip
    story = build_story("r", records=records, log=log, ledger=ledger)
    assert [(e.stage, e.what) for e in story.events] == [
        ("authorizer", "command committed for execution"),
        ("executor", "ledger entry claimed: execution starts"),
        ("executor", "outcome: unknown (timeout)"),
        ("executor", "outcome unknown: handed to reconciliation"),
        ("reconciler", "reconciled from the downstream system: succeeded"),
        ("reconciler", "ledger now: succeeded"),
        ("reconciler", "outcome: succeeded"),
    ]
    assert story.final == "succeeded"
    text = render(story)
    assert "first_run_by  other-call (this call was answered from it)" in text
    assert "reconcile_checks  2" in text
    assert "effect may or may not have happened" in text


def test_events_of_the_same_millisecond_keep_pipeline_order() -> None:
    """The join records the accepted decision (PostgreSQL, microseconds) just before it
    publishes the command (Kafka, milliseconds): within one millisecond the command's
    timestamp can read earlier, and pipeline order decides."""
    records = [
        _record("commands.committed", 3.0, {"operation_id": "tenant-a:c"}),
    ]
    log = [
        {"id": 1, "at": NOW + timedelta(seconds=3.0004), "tenant": "tenant-a",
         "kind": "approval_decision", "detail": {"decision": "approve", "approver": "boss"}},
    ]  # fmt: skip
    story = build_story("c", records=records, log=log, ledger=[])
    assert [e.what for e in story.events] == [
        "decision accepted: approve by boss",
        "command committed for execution",
    ]


def test_every_audit_kind_a_stage_writes_has_its_story() -> None:
    """Writers and readers share `AuditKind`: a new kind without a story line fails here."""
    assert set(_LOG_EVENTS) == set(AuditKind)
