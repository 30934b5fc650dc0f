"""Validator stage: `calls.proposed` → `calls.validated` | outcome | `calls.deadletter`."""

from __future__ import annotations

from datetime import datetime

from commands.catalog import Catalog
from commands.validate import Limits, Malformed, Rejection, parse_envelope, validate
from runtime.emit import dead_letter as dead_letter
from schemas.envelopes import SourcePosition, Stage, Status, ValidatedCall
from schemas.errors import ErrorCode
from schemas.lanes import validated_key
from schemas.names import Topic
from streams.emit import Emit, outcome


def on_proposed(
    raw: bytes | None,
    *,
    source: SourcePosition,
    key: str | None = None,
    catalog: Catalog,
    limits: Limits,
    now: datetime,
    trace_id: str | None,
    policy_version: str | None = None,
) -> tuple[Emit, ...]:
    """Everything the validator publishes for one `calls.proposed` record. Its outcomes carry
    the policy version in force, like every other stage's."""
    parsed = parse_envelope(raw, limits)
    if isinstance(parsed, Malformed):
        letter = dead_letter(
            raw, reason=parsed.reason, call_id=parsed.call_id, source=source, at=now, key=key
        )
        if parsed.call_id is None:
            return (letter,)
        rejected = outcome(
            call_id=parsed.call_id,
            tool="",
            tenant=None,
            status=Status.REJECTED,
            stage=Stage.VALIDATE,
            code=ErrorCode.MALFORMED,
            at=now,
            trace_id=trace_id,
            policy_version=policy_version,
        )
        return (letter, rejected)
    result = validate(parsed, catalog, limits)
    if isinstance(result, Rejection):
        return (
            outcome(
                call_id=parsed.call_id,
                tool=result.tool_name,
                tenant=None,
                status=Status.REJECTED,
                stage=Stage.VALIDATE,
                code=result.code,
                fields=result.fields,
                at=now,
                trace_id=trace_id,
                policy_version=policy_version,
                # A refused address is not honoured, not even for its refusal.
                reply_to=None
                if result.code is ErrorCode.INVALID_REPLY_ADDRESS
                else parsed.reply_to,
            ),
        )
    return (
        Emit(
            topic=Topic.VALIDATED,
            # v1.7: the proposal's lane, so the authorizer reads a tenant on its partitions.
            key=validated_key(key, call_id=parsed.call_id, context=parsed.context),
            value=ValidatedCall(
                call_id=parsed.call_id,
                idempotency_key=parsed.effective_idempotency_key,
                tool=result.tool.name,
                arguments=result.normalized,
                context=parsed.context,
                proposed_at=parsed.proposed_at,
                validated_at=now,
                trace_id=trace_id,
                proof=parsed.proof,
                reply_to=parsed.reply_to,
            ),
        ),
    )
