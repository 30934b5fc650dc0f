"""`ratifier_client.client` (distribution ``ratifier-client``): how an agent runtime reaches
ratifier without writing Kafka code.

    async with RatifierClient.from_settings() as client:  # RATIFIER_KAFKA__BOOTSTRAP, ...
        outcome = await client.call(
            "get_payment", {"payment_id": "pay_A1001"}, context=token,
            idempotency_key=idempotency_key_for(agent="support-bot", run=run_id, step=step_no),
        )

- ``call`` publishes one proposed call and returns its final outcome, or a `Pending` value
  when the wait ends first (the call goes on; ``wait(call_id)`` awaits it again). A wait that
  times out never reads as a failure. ``unknown`` is not final: the reconciler settles it and
  publishes the settled outcome for the same call id, which the client waits for (a `Pending`
  with status ``unknown`` says that is under way).
- ``submit`` returns a `CallHandle` at once: ``await handle.approval()`` resolves when the call
  is ``awaiting_approval`` (with the request's preview and expiry), ``await handle.result()``
  with the final outcome. ``submit_many`` publishes a batch and awaits the broker's acks once.
- Retries reuse the call's id and idempotency key: a broker error while publishing is retried
  with the same record, so one logical call never mints a second key. Derive the key from the
  agent's own step identity (`idempotency_key_for`) and a restarted agent re-proposing the same
  step gets the stored outcome instead of a second effect.
- With a reply topic (``replies=True``, or ``reply_topic=``; contract v1.3), every call names
  it as its ``reply_to`` and the client reads that topic only: ratifier copies each outcome
  and approval request of the call there (they are on `outcomes` and `approvals.requested`
  too). ``replies=True`` creates a topic of the client's own under the reply namespace
  (``<prefix>replies.<client id>``, one partition, short retention) and deletes it on close.
- Without one, outcomes are read without a consumer group, from the client's *home*
  partitions of ``outcomes`` (and ``approvals.requested``) only: the client mints call ids
  whose Kafka key hashes to those partitions (the same murmur2 partitioner every stage's
  producer uses), so it never reads the whole topic, but it still reads the other clients'
  records on those partitions. Duplicate outcome records (at-least-once stages) are dropped
  by call id.
- ``call`` and ``submit_admitted`` (which the adapters and the MCP gateway use) honour
  ``rate_limited`` (contract v1.5): they wait the outcome's ``retry_after`` (plus up to 10 %
  jitter) and propose the call again with the same idempotency key and a new call id, at
  most ``rate_limit_retries`` times (default 3) and within ``within``; then the refusal is
  the answer. ``submit`` never retries: its caller sees the refusal and decides.
- The client starts a W3C trace per call (or continues the caller's ``traceparent``); the
  outcome's ``trace_id`` names it.

`SyncRatifierClient` wraps it for synchronous agents (a private event loop thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from pydantic import ValidationError

from ratifier_client.kafka import kafka_security
from ratifier_client.proofs import sign_call_proof
from ratifier_client.settings import ClientSettings
from ratifier_client.topics import REPLY_RETENTION_MS, delete_reply_topic, ensure_reply_topic
from schemas.connection import KafkaConnection
from schemas.envelopes import ApprovalRequest, Outcome, ReplyAddress, Status
from schemas.errors import ErrorCode
from schemas.lanes import PROPOSAL_LANES, proposal_key
from schemas.names import REPLY_OF_HEADER, TRACEPARENT_HEADER, Topic, reply_namespace, topic_name

log = logging.getLogger("ratifier_client.client")

T = TypeVar("T")

PUBLISH_ATTEMPTS = 5
PUBLISH_BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0)
DEFAULT_WAIT_SECONDS = 60.0  # how long `call` and `result` wait before answering Pending
# `call` proposes a call refused `rate_limited` again at most this many times (by default).
RATE_LIMIT_RETRIES = 3
RATE_LIMIT_JITTER = 0.1  # up to 10 % added to retry_after, so refused agents do not stampede
# The wait advised when a `rate_limited` outcome carries no retry_after (an older stage).
DEFAULT_RETRY_AFTER_SECONDS = 1.0


def rate_limited_wait(result: Outcome | Pending) -> float | None:
    """Seconds to wait before proposing a call again when ``result`` is a ``rate_limited``
    refusal (its ``retry_after``); None for any other result."""
    if not isinstance(result, Outcome) or result.error is None:
        return None
    if result.error.code is not ErrorCode.RATE_LIMITED:
        return None
    advised = result.error.retry_after
    return DEFAULT_RETRY_AFTER_SECONDS if advised is None else advised


class _Limits(Protocol):
    @property
    def kafka_max_message_bytes(self) -> int: ...


class PipelineSettings(Protocol):
    """What the client reads of settings: `ClientSettings`, or the services' `Settings`."""

    @property
    def kafka(self) -> KafkaConnection: ...

    @property
    def topic_prefix(self) -> str: ...

    @property
    def limits(self) -> _Limits: ...


def idempotency_key_for(*, agent: str, run: str, step: str | int) -> str:
    """A stable idempotency key for one logical step of one agent run: the same inputs give
    the same key on every retry and after a restart, different steps different keys."""
    digest = hashlib.sha256(f"{agent}\x00{run}\x00{step}".encode()).hexdigest()
    return f"ik-{digest[:40]}"


@dataclass(frozen=True, kw_only=True)
class Pending:
    """The wait ended before the call's final outcome: the call goes on. ``status`` is the
    last non-terminal status seen (``awaiting_approval``), or None when none was seen yet."""

    call_id: str
    status: Status | None = None
    approval: ApprovalRequest | None = None


@dataclass(frozen=True, kw_only=True)
class AwaitingApproval:
    """The call waits for a human (or the end user): what they are shown and until when."""

    call_id: str
    outcome: Outcome
    request: ApprovalRequest | None

    @property
    def preview(self) -> tuple[str, ...]:
        return self.request.preview if self.request is not None else ()

    @property
    def expires_at(self) -> datetime | None:
        return self.request.expires_at if self.request is not None else None


@dataclass(frozen=True, kw_only=True)
class ProposedToolCall:
    """One call for `RatifierClient.submit_many`."""

    tool: str
    arguments: Mapping[str, Any]
    context: str
    idempotency_key: str | None = None


@dataclass(eq=False)
class _Tracked:
    terminal: asyncio.Future[Outcome]
    awaiting: asyncio.Future[AwaitingApproval]
    last_status: Status | None = None
    request: ApprovalRequest | None = None
    awaiting_outcome: Outcome | None = None


@dataclass(frozen=True, eq=False)
class CallHandle:
    """A published call: its ids and trace, and what it became."""

    call_id: str
    idempotency_key: str
    trace_id: str
    _client: RatifierClient = field(repr=False)

    async def approval(self, within: float = DEFAULT_WAIT_SECONDS) -> AwaitingApproval | None:
        """The approval this call waits for; None when it ended without one (or the wait
        ended first: check `result`)."""
        return await self._client.awaiting_approval(self.call_id, within=within)

    async def result(self, within: float = DEFAULT_WAIT_SECONDS) -> Outcome | Pending:
        return await self._client.wait(self.call_id, within=within)


class RatifierClient:
    """An agent runtime's connection to ratifier (asyncio). Use ``async with``."""

    def __init__(
        self,
        *,
        bootstrap: str | None = None,
        connection: KafkaConnection | None = None,
        topic_prefix: str = "ratifier.",
        home_partitions: int = 1,
        client_id: str | None = None,
        proof_key: Any = None,
        proof_algorithm: str = "EdDSA",
        replies: bool = False,
        reply_topic: str | None = None,
        reply_partition: int | None = None,
        create_reply_topic: bool | None = None,
        reply_retention_ms: int = REPLY_RETENTION_MS,
        max_message_bytes: int = 1_048_588,
        rate_limit_retries: int = RATE_LIMIT_RETRIES,
        lanes: int = PROPOSAL_LANES,
    ) -> None:
        """``connection``: the broker and its security (TLS, SASL), as the services take it;
        ``bootstrap`` alone: a plaintext broker list (or, with ``connection``, its override).
        ``proof_key``: the agent runtime's private key that its context tokens name in
        ``cnf`` (call binding, docs/approvals.md): every call then carries a proof signed
        with it, so a token copied from `calls.proposed` mints nothing.
        ``replies`` / ``reply_topic``: read replies from a reply topic of its own instead of
        the home partitions of `outcomes` (``reply_topic`` must lie under
        ``<topic_prefix>replies.``; ``reply_partition``: the one partition of a shared reply
        topic this client reads). ``create_reply_topic`` (default: when ``replies`` names the
        topic itself) creates it if missing, and deletes it on close. ``lanes``: how many
        lanes (partitions' keys) each tenant's calls are spread over (schemas/lanes.py)."""
        if connection is None:
            connection = KafkaConnection(bootstrap=bootstrap or "127.0.0.1:9092")
        elif bootstrap is not None:
            connection = connection.model_copy(update={"bootstrap": bootstrap})
        self._connection = connection
        self._proof_key = proof_key
        self._lanes = max(1, lanes)
        self._proof_algorithm = proof_algorithm
        self._prefix = topic_prefix
        self._home_count = max(1, home_partitions)
        self._client_id = client_id or f"agent-client-{uuid.uuid4().hex[:8]}"
        self._reply: ReplyAddress | None = None
        if replies or reply_topic is not None:
            topic = reply_topic or f"{reply_namespace(topic_prefix)}{self._client_id}"
            self._reply = ReplyAddress(topic=topic, partition=reply_partition)
            if not self._reply.under(reply_namespace(topic_prefix)):
                raise ValueError(f"a reply topic must start with {reply_namespace(topic_prefix)}")
        self._own_reply_topic = (
            create_reply_topic if create_reply_topic is not None else reply_topic is None
        )
        self._reply_retention_ms = reply_retention_ms
        self._max_message_bytes = max_message_bytes
        self._created_reply_topic = False
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._home: tuple[int, ...] = ()
        self._partitions = 0
        self._calls: dict[str, _Tracked] = {}
        self._reader: asyncio.Task[None] | None = None
        self.records_fetched = 0  # outcome and approval records read (reply-routing figure)
        self._rate_limit_retries = max(0, rate_limit_retries)
        self.rate_limited_retries = 0  # calls proposed again after a rate_limited refusal

    @classmethod
    def from_settings(
        cls, settings: PipelineSettings | None = None, **options: Any
    ) -> RatifierClient:
        """A client on ``settings``' broker and topics: the services' `Settings`, or the
        agent side's `ClientSettings` (by default read from the environment)."""
        if settings is None:
            settings = ClientSettings.from_env()
        options.setdefault("max_message_bytes", settings.limits.kafka_max_message_bytes)
        return cls(connection=settings.kafka, topic_prefix=settings.topic_prefix, **options)

    @property
    def home_partitions(self) -> tuple[int, ...]:
        return self._home

    @property
    def reply_to(self) -> ReplyAddress | None:
        """The reply address every call of this client names (None: home partitions)."""
        return self._reply

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        outcomes = topic_name(self._prefix, Topic.OUTCOMES)
        requests = topic_name(self._prefix, Topic.APPROVALS_REQUESTED)
        self._producer = AIOKafkaProducer(
            **kafka_security(self._connection),
            client_id=self._client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=2,
        )
        self._consumer = AIOKafkaConsumer(
            **kafka_security(self._connection),
            client_id=self._client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=50,
        )
        if self._reply is not None and self._own_reply_topic:
            self._created_reply_topic = await ensure_reply_topic(
                self._connection,
                self._reply.topic,
                partitions=1 if self._reply.partition is None else self._reply.partition + 1,
                retention_ms=self._reply_retention_ms,
                max_message_bytes=self._max_message_bytes,
            )
        await self._producer.start()
        await self._consumer.start()
        partitions = await self._partitions_of(outcomes)
        self._partitions = len(partitions)
        if self._reply is not None:
            # Replies only: every outcome and approval request of this client's calls.
            if self._reply.partition is not None:
                mine = [self._reply.partition]
            else:
                mine = await self._partitions_of(self._reply.topic)
            assigned = [TopicPartition(self._reply.topic, p) for p in mine]
        else:
            self._home = tuple(
                sorted(random.sample(partitions, min(self._home_count, len(partitions))))
            )
            # Approval requests are keyed and partitioned like outcomes (by call id).
            assigned = [TopicPartition(t, p) for t in (outcomes, requests) for p in self._home]
        self._consumer.assign(assigned)
        # Resolve every position before anything is published, so no outcome is missed.
        for tp in assigned:
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read(), name="ratifier-client-reader")

    async def _partitions_of(self, topic: str) -> list[int]:
        assert self._producer is not None
        return sorted(await self._producer.partitions_for(topic))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        for tracked in self._calls.values():
            for future in (tracked.terminal, tracked.awaiting):
                if not future.done():
                    future.cancel()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        if self._created_reply_topic and self._reply is not None:
            self._created_reply_topic = False
            try:
                await delete_reply_topic(self._connection, self._reply.topic)
            except KafkaError as exc:  # its short retention empties it anyway
                log.warning("deleting reply topic %s failed: %s", self._reply.topic, exc)

    # -- publishing ---------------------------------------------------------------------------

    def new_call_id(self) -> str:
        """A fresh call id (without a reply topic: one whose Kafka key lands on one of this
        client's home partitions)."""
        if self._reply is not None:
            return f"call-{uuid.uuid4().hex}"
        while True:
            call_id = f"call-{uuid.uuid4().hex}"
            if self._partition_of(call_id) in self._home:
                return call_id

    def _partition_of(self, key: str) -> int:
        hashed: int = murmur2(key.encode())
        return (hashed & 0x7FFFFFFF) % self._partitions

    def _envelope(
        self, call_id: str, tool: str, arguments: Mapping[str, Any], context: str, key: str
    ) -> bytes:
        envelope: dict[str, Any] = {
            "v": 1,
            "call_id": call_id,
            "idempotency_key": key,
            "tool": tool,
            "arguments": dict(arguments),
            "context": context,
            "proposed_at": datetime.now(UTC).isoformat(),
        }
        if self._reply is not None:
            envelope["reply_to"] = self._reply.model_dump(mode="json", exclude_none=True)
        if self._proof_key is not None:
            # The proof covers the arguments as the validator passes them on: send them
            # complete (defaults included), as the tool's schema has them.
            envelope["proof"] = sign_call_proof(
                self._proof_key,
                call_id=call_id,
                idempotency_key=key,
                tool=tool,
                arguments=dict(arguments),
                context=context,
                algorithm=self._proof_algorithm,
            )
        return json.dumps(envelope, separators=(",", ":")).encode()

    def _track(self, call_id: str) -> _Tracked:
        tracked = self._calls.get(call_id)
        if tracked is None:
            loop = asyncio.get_running_loop()
            tracked = _Tracked(terminal=loop.create_future(), awaiting=loop.create_future())
            self._calls[call_id] = tracked
        return tracked

    async def _publish(self, records: Sequence[tuple[str, bytes, bytes]]) -> None:
        """Send (Kafka key, value, traceparent) records and await every ack; a broker error
        is retried with the very same records (same call ids and idempotency keys)."""
        assert self._producer is not None
        topic = topic_name(self._prefix, Topic.PROPOSED)
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                sent = [
                    await self._producer.send(
                        topic,
                        key=key.encode(),
                        value=value,
                        headers=[(TRACEPARENT_HEADER, traceparent)],
                    )
                    for key, value, traceparent in records
                ]
                await asyncio.gather(*sent)
                return
            except KafkaError:
                if attempt == PUBLISH_ATTEMPTS - 1:
                    raise
                delay = PUBLISH_BACKOFF_SECONDS[min(attempt, len(PUBLISH_BACKOFF_SECONDS) - 1)]
                log.warning("publishing %d call(s) failed; retry in %.1fs", len(records), delay)
                await asyncio.sleep(delay)

    async def submit_many(
        self, calls: Iterable[ProposedToolCall], *, traceparent: str | None = None
    ) -> list[CallHandle]:
        """Publish many calls at once (one wait for all acks) and return their handles."""
        handles: list[CallHandle] = []
        records: list[tuple[str, bytes, bytes]] = []
        for call in calls:
            call_id = self.new_call_id()
            key = call.idempotency_key or call_id
            trace_id, header = _trace(traceparent)
            self._track(call_id)
            records.append(
                (
                    # The tenant's lane (contract v1.6): its flood stays on its partitions.
                    proposal_key(call.context, call_id=call_id, lanes=self._lanes),
                    self._envelope(call_id, call.tool, call.arguments, call.context, key),
                    header,
                )
            )
            handles.append(
                CallHandle(call_id=call_id, idempotency_key=key, trace_id=trace_id, _client=self)
            )
        await self._publish(records)
        return handles

    async def submit(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        context: str,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
    ) -> CallHandle:
        call = ProposedToolCall(
            tool=tool, arguments=arguments, context=context, idempotency_key=idempotency_key
        )
        [handle] = await self.submit_many([call], traceparent=traceparent)
        return handle

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        context: str,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        within: float = DEFAULT_WAIT_SECONDS,
    ) -> Outcome | Pending:
        """Publish one call and wait for its final outcome (or `Pending`); a ``rate_limited``
        refusal is proposed again as `submit_admitted` does."""
        deadline = asyncio.get_running_loop().time() + within
        handle = await self.submit_admitted(
            tool,
            arguments,
            context=context,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
            within=within,
        )
        left = deadline - asyncio.get_running_loop().time()
        return await handle.result(within=max(0.0, left))

    async def submit_admitted(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        context: str,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        within: float = DEFAULT_WAIT_SECONDS,
    ) -> CallHandle:
        """Publish one call and wait until it waits for an approval or ends (or ``within``
        passes). A call refused ``rate_limited`` is proposed again after its ``retry_after``
        (plus up to 10 % jitter), with the SAME idempotency key and a new call id, at most
        ``rate_limit_retries`` times and only while ``within`` allows; the handle of the
        last proposal is returned (its result is the last refusal when a bound was hit)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        retries = 0
        while True:
            handle = await self.submit(
                tool,
                arguments,
                context=context,
                idempotency_key=idempotency_key,
                traceparent=traceparent,
            )
            idempotency_key = handle.idempotency_key  # every retry reuses the first key
            await self.awaiting_approval(handle.call_id, within=max(0.0, deadline - loop.time()))
            wait = rate_limited_wait(await handle.result(within=0))
            if wait is None or retries >= self._rate_limit_retries:
                return handle
            wait *= 1 + random.uniform(0, RATE_LIMIT_JITTER)  # noqa: S311 - jitter, not a secret
            if loop.time() + wait >= deadline:
                return handle
            retries += 1
            self.rate_limited_retries += 1
            log.info("%s rate_limited; proposing it again in %.2fs", handle.call_id, wait)
            self.forget(handle.call_id)
            await asyncio.sleep(wait)

    # -- waiting ------------------------------------------------------------------------------

    async def wait(
        self, call_id: str, *, within: float = DEFAULT_WAIT_SECONDS
    ) -> Outcome | Pending:
        """The call's final outcome, or `Pending` when ``within`` seconds pass first. Only calls
        this client published (or is tracking) can be awaited."""
        tracked = self._calls.get(call_id)
        if tracked is None:
            raise KeyError(f"{call_id} was not published by this client")
        try:
            return await asyncio.wait_for(asyncio.shield(tracked.terminal), within)
        except TimeoutError:
            return Pending(call_id=call_id, status=tracked.last_status, approval=tracked.request)

    async def awaiting_approval(
        self, call_id: str, *, within: float = DEFAULT_WAIT_SECONDS
    ) -> AwaitingApproval | None:
        tracked = self._calls.get(call_id)
        if tracked is None:
            raise KeyError(f"{call_id} was not published by this client")
        waits: set[asyncio.Future[Any]] = {
            asyncio.ensure_future(asyncio.shield(tracked.awaiting)),
            asyncio.ensure_future(asyncio.shield(tracked.terminal)),
        }
        _done, pending = await asyncio.wait(waits, timeout=within, return_when="FIRST_COMPLETED")
        for future in pending:
            future.cancel()
        return tracked.awaiting.result() if tracked.awaiting.done() else None

    def forget(self, call_id: str) -> None:
        """Stop tracking a call (its outcome was consumed)."""
        self._calls.pop(call_id, None)

    async def _read(self) -> None:
        assert self._consumer is not None
        requests = topic_name(self._prefix, Topic.APPROVALS_REQUESTED)
        while True:
            batches = await self._consumer.getmany(timeout_ms=500, max_records=1000)
            for tp, records in batches.items():
                self.records_fetched += len(records)
                for record in records:
                    key = record.key.decode(errors="replace") if record.key else None
                    tracked = self._calls.get(key) if key else None
                    if tracked is None:
                        continue  # another agent's call on a shared partition
                    if _is_request(tp.topic, requests, record.headers):
                        self._on_request(tracked, record.value)
                    else:
                        self._on_outcome(tracked, record.value)

    def _on_request(self, tracked: _Tracked, value: bytes | None) -> None:
        try:
            tracked.request = ApprovalRequest.model_validate_json(value or b"")
        except ValidationError:
            return
        if tracked.awaiting_outcome is not None and not tracked.awaiting.done():
            tracked.awaiting.set_result(
                AwaitingApproval(
                    call_id=tracked.awaiting_outcome.call_id,
                    outcome=tracked.awaiting_outcome,
                    request=tracked.request,
                )
            )

    def _on_outcome(self, tracked: _Tracked, value: bytes | None) -> None:
        try:
            outcome = Outcome.model_validate_json(value or b"")
        except ValidationError:
            log.warning("unreadable outcome record ignored")
            return
        if tracked.terminal.done():
            return  # a repeated outcome (at-least-once stages): the first one stands
        tracked.last_status = outcome.status
        if outcome.terminal and outcome.status is not Status.UNKNOWN:
            tracked.terminal.set_result(outcome)
        elif outcome.status is Status.AWAITING_APPROVAL:
            tracked.awaiting_outcome = outcome
            if tracked.request is not None and not tracked.awaiting.done():
                tracked.awaiting.set_result(
                    AwaitingApproval(
                        call_id=outcome.call_id, outcome=outcome, request=tracked.request
                    )
                )


def _is_request(topic: str, requests: str, headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """Whether a record read is an approval request: on `approvals.requested`, or a reply
    copy of one (its ``ratifier-reply-of`` header)."""
    if topic == requests:
        return True
    for name, value in headers or ():
        if name == REPLY_OF_HEADER:
            return value == Topic.APPROVALS_REQUESTED.value.encode()
    return False


def _trace(traceparent: str | None) -> tuple[str, bytes]:
    """The trace id and the ``traceparent`` header of a new call: the caller's trace, or a
    new one."""
    if traceparent:
        parts = traceparent.split("-")
        if len(parts) >= 4 and len(parts[1]) == 32:
            return parts[1], traceparent.encode()
    trace_id = f"{random.getrandbits(128) or 1:032x}"
    span_id = f"{random.getrandbits(64) or 1:016x}"
    return trace_id, f"00-{trace_id}-{span_id}-01".encode()


class SyncRatifierClient:
    """`RatifierClient` for synchronous code: its own event loop in a daemon thread."""

    def __init__(self, client: RatifierClient) -> None:
        self._client = client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._run(client.start())

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future: ThreadFuture[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        context: str,
        idempotency_key: str | None = None,
        within: float = DEFAULT_WAIT_SECONDS,
    ) -> Outcome | Pending:
        return self._run(
            self._client.call(
                tool, arguments, context=context, idempotency_key=idempotency_key, within=within
            )
        )

    def wait(self, call_id: str, *, within: float = DEFAULT_WAIT_SECONDS) -> Outcome | Pending:
        return self._run(self._client.wait(call_id, within=within))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
