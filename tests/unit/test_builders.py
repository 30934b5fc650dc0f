"""One builder of outcomes (`Outcome.for_call`, `Outcome.for_command`) and one of dead
letters (`runtime.emit.dead_letter` on `DeadLetter.of_raw`), used by every stage."""

from __future__ import annotations

import base64
import hashlib

from runtime.emit import dead_letter
from schemas.envelopes import (
    CommittedCommand,
    DeadLetter,
    FieldProblem,
    Outcome,
    ReplyAddress,
    SourcePosition,
    Stage,
    Status,
)
from schemas.errors import ErrorCode
from schemas.names import Topic
from streams.approval import decision_dead_letter
from tests.unit.conftest import NOW
from tests.unit.test_freezes import authorized_refund

SOURCE = SourcePosition(topic="calls.proposed", partition=0, offset=7)


def committed() -> CommittedCommand:
    call = authorized_refund()
    fields = {
        k: v
        for k, v in call.model_dump().items()
        if k in CommittedCommand.model_fields and k != "v"
    }
    fields["reply_to"] = ReplyAddress(topic="ratifier.replies.agent-1", partition=0)
    return CommittedCommand(**fields, committed_at=NOW)


def test_an_outcome_for_a_command_carries_what_the_command_carries() -> None:
    command = committed()
    outcome = Outcome.for_command(
        command, status=Status.FAILED, stage=Stage.EXECUTE, at=NOW,
        code=ErrorCode.PERMANENT_ERROR, trace_id="ab" * 16,
    )  # fmt: skip
    assert outcome.call_id == command.call_id
    assert outcome.tenant == command.tenant
    assert outcome.operation_id == command.operation_id
    assert outcome.policy_version == command.policy_version
    assert outcome.approval == command.approval
    assert outcome.reply_to == command.reply_to
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.PERMANENT_ERROR
    assert outcome.trace_id == "ab" * 16


def test_an_outcome_for_a_call_takes_a_specific_error_over_its_codes_generic_one() -> None:
    problem = FieldProblem(path="$.amount", problem="must be positive")
    generic = Outcome.for_call(
        call_id="c-1", tool="refund", tenant="t", status=Status.REJECTED,
        stage=Stage.VALIDATE, at=NOW, code=ErrorCode.INVALID_ARGUMENTS, fields=(problem,),
    )  # fmt: skip
    assert generic.error is not None
    assert generic.error.fields == (problem,)
    succeeded = Outcome.for_call(
        call_id="c-1", tool="refund", tenant="t", status=Status.SUCCEEDED,
        stage=Stage.EXECUTE, at=NOW, result={"ok": True},
    )  # fmt: skip
    assert succeeded.error is None
    assert succeeded.result == {"ok": True}


def test_a_dead_letter_keeps_a_bounded_prefix_and_is_keyed_like_its_source() -> None:
    raw = b"x" * 10_000
    emit = dead_letter(raw, reason="not JSON", call_id=None, source=SOURCE, at=NOW, key="k-1")
    assert emit.topic is Topic.DEADLETTER
    assert emit.key == "k-1"
    letter = emit.value
    assert isinstance(letter, DeadLetter)
    assert letter.raw_truncated
    assert len(base64.b64decode(letter.raw_base64)) == 4096
    assert letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
    by_call = dead_letter(b"{}", reason="r", call_id="c-9", source=SOURCE, at=NOW)
    assert by_call.key == "c-9"


def test_a_decision_dead_letter_keeps_no_byte_of_the_record() -> None:
    raw = b'{"token": "secret-bearer"}'
    emit = decision_dead_letter(raw, reason="unreadable", key="c-1", source=SOURCE, at=NOW)
    letter = emit.value
    assert isinstance(letter, DeadLetter)
    assert letter.raw_base64 == ""
    assert letter.raw_size == len(raw)
    assert letter.raw_truncated
    assert letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
