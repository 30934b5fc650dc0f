"""Policy distribution: policy sets are published to the compacted `policies` topic, and
every running authorizer and executor follows it, switching to the newest valid set without a
restart. An invalid set is refused and the current one kept, with an error in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from commands.policy import DEFAULT_POLICY_DIR, PolicySet
from runtime.clients import kafka_producer
from runtime.reader import TopicReader
from schemas.envelopes import PolicySetRecord
from schemas.errors import ConfigurationError
from schemas.fingerprint import canonical_json
from schemas.names import Topic
from schemas.settings import Settings

log = logging.getLogger("ratifier.policies")


def local_policies(settings: Settings) -> PolicySet:
    return PolicySet.from_directory(Path(settings.policy_dir or DEFAULT_POLICY_DIR))


def policy_record(settings: Settings, policies: PolicySet) -> PolicySetRecord:
    return PolicySetRecord(
        name=settings.policy_set_name,
        policies=policies.text,
        cedar_schema=json.loads(policies.schema),
        version=policies.version,
        published_at=datetime.now(UTC),
    )


async def publish_policies(settings: Settings, record: PolicySetRecord) -> None:
    producer = kafka_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topic(Topic.POLICIES), key=record.name.encode(), value=record.to_bytes()
        )
    finally:
        await producer.stop()


@dataclass(frozen=True, kw_only=True)
class Refusal:
    version: str
    reason: str
    at: datetime


class PolicyFeed:
    """The current policy set of this process, kept up to date from the `policies` topic."""

    def __init__(
        self,
        settings: Settings,
        initial: PolicySet,
        on_change: Callable[[PolicySet], None] | None = None,
    ) -> None:
        self._settings = settings
        self._current = initial
        self._on_change = on_change
        self._reader = TopicReader(settings, [Topic.POLICIES], lambda _t, raw: self.apply(raw))
        self.refusals: list[Refusal] = []

    @property
    def current(self) -> PolicySet:
        return self._current

    def apply(self, raw: bytes | None) -> None:
        """Switch to the set in ``raw`` if it is for us, valid and new; refuse it otherwise."""
        try:
            record = PolicySetRecord.model_validate_json(raw or b"")
        except ValidationError:
            self._refuse("?", "unreadable policies record")
            return
        if record.name != self._settings.policy_set_name or record.version == self._current.version:
            return
        try:
            candidate = PolicySet.from_sources(record.policies, canonical_json(record.cedar_schema))
        except ConfigurationError as exc:
            self._refuse(record.version, exc.safe_message)
            return
        if candidate.version != record.version:
            self._refuse(record.version, f"content hashes to {candidate.version}")
            return
        previous, self._current = self._current, candidate
        log.warning("policy set switched from %s to %s", previous.version, candidate.version)
        if self._on_change is not None:
            self._on_change(candidate)

    def _refuse(self, version: str, reason: str) -> None:
        self.refusals.append(Refusal(version=version, reason=reason, at=datetime.now(UTC)))
        log.error("REFUSED policy set %s: %s; keeping %s", version, reason, self._current.version)

    async def catch_up(self) -> None:
        """Read the topic to its current end, so a starting process uses the newest set. The
        consumer is closed afterwards (start-up may run in another event loop than the
        process's); :meth:`follow` resumes where this stopped."""
        try:
            await self._reader.catch_up()
        finally:
            await self._reader.close()

    async def follow(self, stop: asyncio.Event | None = None) -> None:
        """Apply every new record until cancelled (or ``stop`` is set)."""
        await self._reader.follow(stop=stop)
