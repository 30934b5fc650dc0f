"""The approval inbox as approvers see it: requests on `approvals.requested` that have no
terminal outcome yet, per tenant. Read from the topics (the join's table is partitioned
across workers; the topics are the whole picture), and decisions published as signed
`approvals.decided` records: the inbox never writes state.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import ValidationError

from schemas.envelopes import (
    TERMINAL_STATUSES,
    Actor,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalVerdict,
)
from schemas.errors import PolicyDenied, ResourceNotFound, Unauthenticated
from schemas.identity import ContextKeys, verify_context_token
from schemas.names import Topic
from schemas.settings import Settings
from streams.approval import APPROVER_ROLE

_TERMINAL = {s.value for s in TERMINAL_STATUSES}


def approver_from(token: str | None, keys: ContextKeys) -> Actor:
    """The approver named by ``token``; it must verify and carry the approver role."""
    if not token:
        raise Unauthenticated()
    actor = verify_context_token(token, keys)
    if APPROVER_ROLE not in actor.roles:
        raise PolicyDenied("This token does not carry the approver role.")
    return actor


class ApprovalInbox:
    """Pending requests, kept from the `approvals.requested` and `outcomes` topics."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pending: dict[str, ApprovalRequest] = {}
        self._ended: set[str] = set()
        self._positions: dict[TopicPartition, int] = {}

    def apply(self, topic: str, value: bytes | None) -> None:
        try:
            body = json.loads(value or b"")
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        if topic == self._settings.topic(Topic.APPROVALS_REQUESTED):
            try:
                request = ApprovalRequest.model_validate(body)
            except ValidationError:
                return
            if request.call_id not in self._ended:
                self._pending[request.call_id] = request
        elif body.get("status") in _TERMINAL and isinstance(body.get("call_id"), str):
            self._ended.add(body["call_id"])
            self._pending.pop(body["call_id"], None)

    def pending(self, tenant: str, now: datetime | None = None) -> list[ApprovalRequest]:
        now = now or datetime.now(UTC)
        return sorted(
            (r for r in self._pending.values() if r.tenant == tenant and r.expires_at > now),
            key=lambda r: r.expires_at,
        )

    def get(self, tenant: str, call_id: str) -> ApprovalRequest:
        """The pending request; absent and other tenants' look the same."""
        request = self._pending.get(call_id)
        if request is None or request.tenant != tenant:
            raise ResourceNotFound()
        return request

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            self._settings.topic(Topic.APPROVALS_REQUESTED),
            self._settings.topic(Topic.OUTCOMES),
            bootstrap_servers=self._settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )

    async def catch_up(self) -> None:
        """Read both topics to their current ends."""
        consumer = self._consumer()
        await consumer.start()
        try:
            tps = sorted(consumer.assignment())
            for tp in tps:
                if tp in self._positions:
                    consumer.seek(tp, self._positions[tp])
                else:
                    await consumer.seek_to_beginning(tp)
            ends = await consumer.end_offsets(tps)
            remaining = {tp for tp in tps if ends[tp] > 0}
            while remaining:
                batches = await consumer.getmany(*remaining, timeout_ms=500, max_records=5000)
                for tp, records in batches.items():
                    for record in records:
                        self.apply(tp.topic, record.value)
                for tp in list(remaining):
                    self._positions[tp] = await consumer.position(tp)
                    if self._positions[tp] >= ends[tp]:
                        remaining.discard(tp)
        finally:
            await consumer.stop()

    async def follow(self, every: float = 1.0) -> None:
        while True:
            await self.catch_up()
            await asyncio.sleep(every)


def decision_for(
    request: ApprovalRequest,
    *,
    token: str,
    verdict: ApprovalVerdict,
    reason: str | None = None,
    arguments: dict[str, Any] | None = None,
    fingerprint: str | None = None,
) -> ApprovalDecision:
    """A decision bound to the request the human saw (its fingerprint)."""
    return ApprovalDecision(
        call_id=request.call_id,
        fingerprint=fingerprint or request.fingerprint,
        decision=verdict,
        arguments=arguments,
        reason=reason,
        approver=token,
        decided_at=datetime.now(UTC),
    )


async def publish_decision(settings: Settings, decision: ApprovalDecision) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topic(Topic.APPROVALS_DECIDED),
            key=decision.call_id.encode(),
            value=decision.to_bytes(),
        )
    finally:
        await producer.stop()
