"""Records of the v1 wire contract. Every record carries ``"v": 1``.

Models are frozen and forbid unknown keys; conversion to and from bytes happens only at the
Kafka edge (`to_bytes`, `model_validate_json`).
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from schemas.errors import (
    CUSTOMER_DECLINED_MESSAGE,
    RETRYABLE_CODES,
    SAFE_MESSAGES,
    ErrorCode,
    RefusalReason,
)

CALL_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
TENANT_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

CallId = Annotated[str, StringConstraints(pattern=CALL_ID_PATTERN)]
IdempotencyKey = Annotated[str, StringConstraints(pattern=CALL_ID_PATTERN)]
ToolName = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Tenant = Annotated[str, StringConstraints(pattern=TENANT_PATTERN)]
ShortText = Annotated[str, StringConstraints(max_length=512)]
PolicyId = Annotated[str, StringConstraints(max_length=128)]
JsonObject = dict[str, Any]
# A Kafka topic name (the broker's legal characters and length).
REPLY_TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
MAX_REPLY_PARTITION = 1023


class Part(BaseModel):
    """A value nested inside a record: frozen, unknown keys forbidden."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Record(Part):
    """A top-level record on a topic."""

    v: Literal[1] = 1

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=False).encode()


class CallFormat(StrEnum):
    NATIVE = "native"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    MCP = "mcp"


class Effect(StrEnum):
    READ = "read"
    REVERSIBLE_WRITE = "reversible_write"
    EXTERNAL_WRITE = "external_write"
    DESTRUCTIVE = "destructive"


class Status(StrEnum):
    REJECTED = "rejected"
    DENIED = "denied"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    CONFLICT = "conflict"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: frozenset[Status] = frozenset(set(Status) - {Status.AWAITING_APPROVAL})


class Stage(StrEnum):
    VALIDATE = "validate"
    AUTHORIZE = "authorize"
    APPROVE = "approve"
    EXECUTE = "execute"
    RECONCILE = "reconcile"


class Route(StrEnum):
    AUTO = "auto"
    APPROVAL = "approval"


class ReplyAddress(Part):
    """Where a copy of the call's outcomes (and its approval request) is also published, so
    that an agent process reads its own replies only (v1.3, additive). ``topic`` is a full
    topic name and must lie under the deployment's reply namespace (``<topic_prefix>replies.``):
    any other is refused by the validator (``invalid_reply_address``). ``partition``: the
    partition to write (a shared reply topic, one partition per client); absent: chosen by
    the record's key (the call id)."""

    topic: Annotated[str, StringConstraints(pattern=REPLY_TOPIC_PATTERN)]
    partition: int | None = Field(default=None, ge=0, le=MAX_REPLY_PARTITION)

    def under(self, namespace: str) -> bool:
        """Whether this address lies in ``namespace`` (a topic-name prefix), strictly below it."""
        return bool(namespace) and self.topic.startswith(namespace) and self.topic != namespace


class ProposedCall(Record):
    """`calls.proposed`, key the tenant's lane `<tenant>#<lane>` (v1.6) or `call_id`: a
    model's tool call, as the agent runtime sends it."""

    call_id: CallId
    idempotency_key: IdempotencyKey | None = None
    tool: ToolName | None = None
    # An object, or a string holding JSON (as OpenAI sends it). Any other JSON value is
    # accepted here and rejected by the validator as invalid_arguments, with a field path.
    arguments: Any = None
    context: str = Field(min_length=1, max_length=8192)
    format: CallFormat = CallFormat.NATIVE
    call: JsonObject | None = None
    proposed_at: datetime
    # v1.2: a compact JWS by the key the context token names in `cnf` over this call
    # (`ratifier_client.proofs.sign_call_proof`); required where the tenant requires call binding.
    proof: str | None = Field(default=None, max_length=4096)
    # v1.3: a copy of every outcome of this call goes there too (besides `outcomes`).
    reply_to: ReplyAddress | None = None

    @model_validator(mode="after")
    def _shape_matches_format(self) -> Self:
        if self.format is CallFormat.NATIVE:
            if self.tool is None or self.arguments is None:
                raise ValueError("a native call needs 'tool' and 'arguments'")
            if self.call is not None:
                raise ValueError("a native call must not carry 'call'")
        elif self.call is None:
            raise ValueError(f"a {self.format.value} call needs 'call'")
        return self

    @property
    def effective_idempotency_key(self) -> str:
        return self.idempotency_key or self.call_id


class ValidatedCall(Record):
    """`calls.validated`, key its proposal's tenant lane (v1.7) or `call_id`: a call whose
    tool exists and whose arguments are schema-valid and normalized. The context token is
    passed on unverified: the authorizer verifies it."""

    call_id: CallId
    idempotency_key: IdempotencyKey
    tool: ToolName
    arguments: JsonObject
    context: str
    proposed_at: datetime
    validated_at: datetime
    trace_id: str | None = None
    proof: str | None = None  # v1.2: passed on unverified, like the context
    reply_to: ReplyAddress | None = None  # v1.3: checked by the validator, carried on


class Actor(Part):
    """The verified principal, taken from the signed context and nowhere else."""

    sub: str = Field(min_length=1, max_length=256)
    tenant: Tenant
    roles: tuple[str, ...] = ()
    sid: str | None = None


class ActorRef(Part):
    """The actor as recorded on a committed command."""

    sub: str
    roles: tuple[str, ...] = ()


class AuthorizedCall(Record):
    """`calls.authorized`, key `call_id`: permitted, routed to approval, or to auto-commit by
    the approval-join (an `@approval("auto")` receipt). Since v1.8 a call the authorizer
    commits itself (routed auto, no receipt to sign) has no `calls.authorized` record: its
    `commands.committed` record is the authorization's record (streams/commit.py)."""

    call_id: CallId
    operation_id: str
    idempotency_key: IdempotencyKey
    tenant: Tenant
    actor: ActorRef
    tool: ToolName
    arguments: JsonObject
    fingerprint: str
    effect: Effect
    policy_version: str
    route: Route
    proposed_at: datetime
    authorized_at: datetime
    trace_id: str | None = None
    # The `@id` of the permit policies that allowed the call (v1.2, additive).
    policies: tuple[PolicyId, ...] = Field(default=(), max_length=16)
    # v1.2: the policy whose `@approval("auto")` sent a call that would need an approval
    # (by its effect) to auto-commit; the approval-join issues the signed receipt naming it.
    auto_approved_by: str | None = None
    # v1.2: whom the resource the call acts on belongs to (its loader's owner attribute,
    # e.g. a payment's customer): the subject who may confirm the call.
    resource_owner: str | None = Field(default=None, max_length=256)
    reply_to: ReplyAddress | None = None  # v1.3: the call's reply address, carried on
    # v1.4: the authorizer published this call's `commands.committed` record itself (a call
    # routed `auto` that needs no receipt); the approval-join leaves the record alone. Absent
    # (an older authorizer's record): the approval-join commits an auto-routed call as before.
    committed: bool = Field(
        default=False,
        description="v1.4: the authorizer published this call's commands.committed record "
        "itself; the approval-join leaves the record alone",
    )
    # v1.5: the call id of the approval request this call joins (an earlier call with the same
    # idempotency key and fingerprint, still waiting): the record is keyed by that call id, so
    # it reaches that request's state in the approval-join, which answers both calls.
    joins: CallId | None = Field(
        default=None,
        description="v1.5: the call id of the pending approval request of the same operation "
        "that this call joins; the record is keyed by that call id",
    )


class ApprovalReceipt(Part):
    """Why a command that needs an approval may run: who (or which policy) approved which
    call, fingerprint and policy version, until when. Since v1.2 it is signed by ratifier's
    approval service (``signature``: a compact JWS, ``typ`` ``ratifier-receipt+jws``, over the
    other fields) and the executor re-verifies it at commit time; an unsigned receipt no longer
    lets an approval-needing command run (it ends ``failed/precondition_failed``)."""

    approver: str
    decided_at: datetime
    expires_at: datetime
    fingerprint: str
    call_id: CallId | None = None
    tenant: Tenant | None = None
    policy_version: str | None = None
    # Every distinct approver whose decision counted (four-eyes: two), and their decision ids.
    approvers: tuple[str, ...] = ()
    decision_ids: tuple[str, ...] = ()
    # `approver`, `confirmation` (the subject the call acts for) or `auto` (a policy).
    basis: str | None = None
    # The policy id whose `@approval("auto")` approved the call (basis `auto`).
    auto_policy: str | None = None
    signature: str | None = Field(default=None, max_length=8192)

    def signed_part(self) -> dict[str, Any]:
        """What the signature covers: every field but the signature itself."""
        return self.model_dump(mode="json", exclude={"signature"})


class CommittedCommand(Record):
    """`commands.committed`, key `operation_id` (= tenant + ':' + idempotency key)."""

    operation_id: str
    call_id: CallId
    tenant: Tenant
    actor: ActorRef
    tool: ToolName
    arguments: JsonObject
    fingerprint: str
    effect: Effect
    policy_version: str
    approval: ApprovalReceipt | None = None
    committed_at: datetime
    reply_to: ReplyAddress | None = None  # v1.3: the call's reply address, carried on
    # v1.8: the `@id` of the permit policies that allowed the call, as its authorization
    # found them: for a call the authorizer commits itself, the only record of them (it has
    # no `calls.authorized` record since v1.8).
    policies: tuple[PolicyId, ...] = Field(
        default=(),
        max_length=16,
        description="v1.8: the @id of the permit policies that allowed the call",
    )

    @property
    def idempotency_key(self) -> str:
        return self.operation_id.removeprefix(f"{self.tenant}:")


class FieldProblem(Part):
    path: str = Field(max_length=256)
    problem: str = Field(max_length=200)


# Longest specific message an outcome carries (a policy's, a handler's or an approver's).
MAX_REASON_MESSAGE = 300


class ErrorInfo(Part):
    """Why a call did not succeed. ``message`` is always safe to show a model: the code's
    generic text, or a specific one its author marked safe (a policy's ``@message``, a
    handler's ``for_model``, an approver's reason). ``reason`` and ``policies`` (v1.2,
    additive) say which rule decided: the ``@id`` of the policies, and whether a ``forbid``
    fired, no ``permit`` matched, or a policy could not be evaluated."""

    code: ErrorCode
    message: ShortText
    retryable: bool
    fields: tuple[FieldProblem, ...] = ()
    reason: RefusalReason | None = None
    policies: tuple[PolicyId, ...] = Field(default=(), max_length=16)
    # v1.5: seconds after which the same call (same idempotency key) may be proposed again
    # with a fair chance of admission (``rate_limited``), or a downstream whose breaker is
    # open may be tried again (``unavailable``); absent: no advice.
    retry_after: float | None = Field(
        default=None,
        ge=0,
        description="v1.5: seconds to wait before proposing the same call again",
    )

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str | None = None,
        fields: tuple[FieldProblem, ...] = (),
        *,
        reason: RefusalReason | None = None,
        policies: tuple[str, ...] = (),
        retry_after: float | None = None,
    ) -> ErrorInfo:
        specific = " ".join((message or "").split())[:MAX_REASON_MESSAGE]
        return cls(
            code=code,
            message=specific or SAFE_MESSAGES[code],
            retryable=code in RETRYABLE_CODES,
            fields=fields,
            reason=reason,
            policies=tuple(p[:128] for p in policies[:16]),
            retry_after=retry_after,
        )

    @classmethod
    def approver_rejected(cls, reason: str | None, *, by_customer: bool = False) -> ErrorInfo:
        """`approval_rejected` carrying the approver's own words, when they gave any; one
        declined by the customer (their confirmation) says so."""
        text = " ".join((reason or "").split())
        generic = SAFE_MESSAGES[ErrorCode.APPROVAL_REJECTED]
        said = CUSTOMER_DECLINED_MESSAGE if by_customer else generic
        message = f"{said} Reason: {text}" if text else said
        return cls.of(ErrorCode.APPROVAL_REJECTED, message, reason=RefusalReason.APPROVER)


class Outcome(Record):
    """`outcomes`, key `call_id`: one terminal outcome per call. Stages are at-least-once, so a
    redelivered record may repeat an identical outcome: deduplicate by `call_id`."""

    call_id: CallId
    tool: str
    tenant: Tenant | None
    status: Status
    stage: Stage
    error: ErrorInfo | None = None
    result: JsonObject | None = None
    resource_id: str | None = None
    operation_id: str | None = None
    policy_version: str | None = None
    approval: ApprovalReceipt | None = None
    at: datetime
    trace_id: str | None = None
    # v1.3: the call's reply address; the record is also published there (keyed by call id).
    reply_to: ReplyAddress | None = None
    # v1.5: this call repeated an operation (same tenant and idempotency key): the call id of
    # the call whose outcome (or approval request) it was given.
    repeats: CallId | None = Field(
        default=None,
        description="v1.5: the call id of the earlier call of the same operation whose "
        "outcome (or approval request) this call was given",
    )

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def for_call(
        cls,
        *,
        call_id: str,
        tool: str,
        tenant: str | None,
        status: Status,
        stage: Stage,
        at: datetime,
        code: ErrorCode | None = None,
        fields: tuple[FieldProblem, ...] = (),
        error: ErrorInfo | None = None,
        result: dict[str, Any] | None = None,
        resource_id: str | None = None,
        operation_id: str | None = None,
        policy_version: str | None = None,
        approval: ApprovalReceipt | None = None,
        trace_id: str | None = None,
        reply_to: ReplyAddress | None = None,
        repeats: str | None = None,
    ) -> Outcome:
        """The one way an outcome is built: ``error``, when given, replaces the generic one
        of ``code`` (with ``fields``); neither means no error (a success, a wait)."""
        return cls(
            call_id=call_id,
            tool=tool,
            tenant=tenant,
            status=status,
            stage=stage,
            error=error or (ErrorInfo.of(code, fields=fields) if code is not None else None),
            result=result,
            resource_id=resource_id,
            operation_id=operation_id,
            policy_version=policy_version,
            approval=approval,
            at=at,
            trace_id=trace_id,
            reply_to=reply_to,
            repeats=repeats,
        )

    @classmethod
    def for_command(
        cls,
        command: CommittedCommand,
        *,
        status: Status,
        stage: Stage,
        at: datetime,
        code: ErrorCode | None = None,
        error: ErrorInfo | None = None,
        result: dict[str, Any] | None = None,
        resource_id: str | None = None,
        trace_id: str | None = None,
    ) -> Outcome:
        """The outcome of a committed command: its call, operation, policy version, approval
        and reply address as the command carries them."""
        return cls.for_call(
            call_id=command.call_id,
            tool=command.tool,
            tenant=command.tenant,
            status=status,
            stage=stage,
            at=at,
            code=code,
            error=error,
            result=result,
            resource_id=resource_id,
            operation_id=command.operation_id,
            policy_version=command.policy_version,
            approval=command.approval,
            trace_id=trace_id,
            reply_to=command.reply_to,
        )


class SourcePosition(Part):
    topic: str
    partition: int
    offset: int


# How much of an unreadable record a dead letter keeps. A dead letter must always fit where
# its source fitted: the digest and size identify the original, the prefix shows what it was.
DEAD_LETTER_PREFIX_BYTES = 4096


class DeadLetter(Record):
    """`calls.deadletter`, key `call_id` when one could be recovered: what identifies the raw
    record (SHA-256 and size) and a bounded prefix of it, never the whole record (v1.1: before,
    ``raw_base64`` held the whole record; such records read as a prefix that is complete)."""

    call_id: str | None
    reason: ShortText
    raw_base64: str = Field(
        max_length=4 * ((DEAD_LETTER_PREFIX_BYTES + 2) // 3),
        description=f"base64 of the record's first {DEAD_LETTER_PREFIX_BYTES} bytes at most",
    )
    raw_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    raw_size: int | None = Field(default=None, ge=0)
    raw_truncated: bool = False
    source: SourcePosition
    at: datetime

    @classmethod
    def of_raw(
        cls,
        raw: bytes | None,
        *,
        reason: str,
        call_id: str | None,
        source: SourcePosition,
        at: datetime,
        keep_prefix: bool = True,
    ) -> DeadLetter:
        """A dead letter for ``raw`` of any size: digest, size and a bounded prefix (none
        with ``keep_prefix=False``: a record that may hold a credential is not copied)."""
        data = raw or b""
        prefix = data[:DEAD_LETTER_PREFIX_BYTES] if keep_prefix else b""
        return cls(
            call_id=call_id,
            reason=reason[:512],
            raw_base64=base64.b64encode(prefix).decode(),
            raw_sha256=hashlib.sha256(data).hexdigest(),
            raw_size=len(data),
            raw_truncated=len(prefix) < len(data),
            source=source,
            at=at,
        )


class ApprovalRequest(Record):
    """`approvals.requested`, key `call_id`: what a human sees and decides on."""

    call_id: CallId
    operation_id: str
    tenant: Tenant
    tool: ToolName
    arguments: JsonObject
    preview: tuple[str, ...]
    fingerprint: str
    effect: Effect
    policy_version: str
    requested_by: str
    expires_at: datetime
    # v1.2: the subject the call acts for (the resource's owner), who may confirm it, and
    # how many distinct approvers it needs.
    subject: str | None = None
    required_approvals: int = Field(default=1, ge=1)
    # v1.3: the call's reply address; the request is also published there (keyed by call id).
    reply_to: ReplyAddress | None = None


class ApprovalVerdict(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"


class DecisionKind(StrEnum):
    APPROVER = "approver"  # a person with approver rights (staff)
    CONFIRMATION = "confirmation"  # the subject the call acts for confirms its exact preview


class NotificationDeadLetter(Record):
    """`notifications.deadletter`, key `call_id` (v1.5): an approval notification the notifier
    gave up on (its attempts or its age reached the bound). Names the endpoint, never its URL
    or secret."""

    delivery_id: str = Field(min_length=1, max_length=128)
    call_id: CallId
    tenant: Tenant
    endpoint: str = Field(min_length=1, max_length=128)
    kind: DecisionKind
    attempts: int = Field(ge=0)
    # Why the last attempt failed (an HTTP status or a connection error), bounded.
    last_error: ShortText | None = None
    first_queued_at: datetime
    at: datetime


class DecisionApprover(Part):
    """Who decided: an identity, never a credential."""

    sub: str = Field(min_length=1, max_length=256)
    tenant: Tenant
    roles: tuple[str, ...] = ()


class DecisionStatement(Part):
    """The signed content of a decision (the JWS payload of `ApprovalDecision.statement`,
    ``typ`` ``ratifier-decision+jws``): bound to one call, its tenant and fingerprint, valid
    from ``issued_at`` to ``not_after``."""

    decision_id: CallId
    call_id: CallId
    tenant: Tenant
    fingerprint: str = Field(min_length=1, max_length=256)
    decision: ApprovalVerdict
    arguments: JsonObject | None = None
    approver: DecisionApprover
    kind: DecisionKind = DecisionKind.APPROVER
    reason: ShortText | None = None
    issued_at: datetime
    not_after: datetime


class ApprovalDecision(Record):
    """`approvals.decided`, key `call_id`: a decision as a signed statement (v2).

    ``statement`` is a compact JWS (EdDSA or ES256) over a `DecisionStatement`, signed by
    ratifier's approval service after it authenticated the human (HTTP API, CLI, dashboard) or
    by the approver's own key from the approvers' JWKS. ``call_id``, ``decision_id``,
    ``decision`` and ``decided_by`` (the approver's ``sub``) are readable copies for
    dashboards and audits; a record whose copies differ from the signed values is refused.
    The record carries no credential: copied elsewhere it approves nothing. A v1 record (with
    the approver's bearer token) is refused as ``unsigned``."""

    v: Literal[2] = 2  # type: ignore[assignment]  # v1 carried a bearer token
    call_id: CallId
    decision_id: CallId
    decision: ApprovalVerdict
    decided_by: str = Field(min_length=1, max_length=256)
    statement: str = Field(min_length=1, max_length=16384, description="compact JWS")


class CancelRequest(Record):
    """`calls.cancelled`, key `call_id`: the agent runtime withdraws a call."""

    call_id: CallId
    reason: ShortText | None = None
    at: datetime


class PolicySetRecord(Record):
    """`policies` (compacted), key `name`: a Cedar policy set distributed to authorizers."""

    name: str
    policies: str
    cedar_schema: JsonObject
    version: str
    published_at: datetime
    # v1.5: the spending budgets declared beside the policies (docs/budgets.md), each as
    # its declaration; part of the set's version. Absent: the set has none.
    budgets: tuple[JsonObject, ...] | None = None

    # v1.5: admission limits declared beside the policies (``limits.toml``); absent: none.
    limits: JsonObject | None = None

    def to_bytes(self) -> bytes:
        # A set without budgets is the v1.4 record exactly: workers not yet upgraded (which
        # refuse unknown fields) keep reading it during a rolling upgrade.
        absent = {name for name in ("budgets", "limits") if getattr(self, name) is None}
        if absent:
            return self.model_dump_json(exclude=absent).encode()
        return super().to_bytes()


# A freeze's scope (the `controls` key): `tenant:T`, `agent:T:sub`, `subject:T:sub`,
# `tool:T:name`, `writes:T`, or `writes:*` (every tenant's writes).
FREEZE_SCOPE_PATTERN = (
    r"^(?:(?:tenant|writes):[A-Za-z0-9_-]{1,64}|writes:\*"
    r"|(?:agent|subject|tool):[A-Za-z0-9_-]{1,64}:[^\s]{1,256})$"
)


class FreezeRecord(Record):
    """`controls` (compacted), key `scope` (v1.5, additive): the kill switch. ``frozen``
    true stops new calls, committed commands not started yet and approvals in ``scope``;
    false lifts it. ``by`` is the operator's ``sub`` (an identity, never a credential)."""

    scope: Annotated[str, StringConstraints(pattern=FREEZE_SCOPE_PATTERN)]
    frozen: bool
    by: str = Field(min_length=1, max_length=256)
    by_tenant: Tenant | None = None
    reason: ShortText = ""
    at: datetime


# A circuit breaker's name (the `breakers` key): `<downstream>:<read|write>`.
BREAKER_NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}:(?:read|write)$"


class BreakerTransition(Record):
    """`breakers`, key `breaker` (v1.5, additive): a circuit breaker of a downstream changed
    state (``closed``, ``open``, ``half_open``), published by the executor that moved it.
    ``calls``, ``failures`` and ``slow`` are the window it judged (zero when a cool-down or a
    probe moved it); ``retry_after`` is the cool-down an open breaker answers with."""

    breaker: Annotated[str, StringConstraints(pattern=BREAKER_NAME_PATTERN)]
    from_state: Literal["closed", "open", "half_open"]
    to_state: Literal["closed", "open", "half_open"]
    reason: ShortText = ""
    calls: int = Field(default=0, ge=0)
    failures: int = Field(default=0, ge=0)
    slow: int = Field(default=0, ge=0)
    retry_after: float | None = Field(default=None, ge=0)
    by: str = Field(min_length=1, max_length=256)
    at: datetime


CONTRACT_RECORDS: dict[str, type[Record]] = {
    "calls.proposed": ProposedCall,
    "calls.validated": ValidatedCall,
    "calls.authorized": AuthorizedCall,
    "calls.deadletter": DeadLetter,
    "calls.cancelled": CancelRequest,
    "approvals.requested": ApprovalRequest,
    "approvals.decided": ApprovalDecision,
    "commands.committed": CommittedCommand,
    # An operation whose outcome is unknown, handed to reconciliation (key: operation_id).
    "commands.unknown": CommittedCommand,
    "outcomes": Outcome,
    "policies": PolicySetRecord,
    "controls": FreezeRecord,
    # v1.5: approval notifications the notifier gave up on (docs/notifications.md).
    "notifications.deadletter": NotificationDeadLetter,
    # v1.5: circuit breaker state changes (docs/execution.md, "Circuit breakers").
    "breakers": BreakerTransition,
}
