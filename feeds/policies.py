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

from commands.budgets import parse_budgets
from commands.catalog import load_catalog
from commands.limits import NO_LIMITS, parse_limits
from commands.policy import DEFAULT_POLICY_DIR, PolicySet, catalog_mismatches
from config.settings import Settings
from runtime.clients import kafka_admin, kafka_producer, start_kafka_client
from runtime.reader import TopicReader
from schemas.envelopes import PolicySetRecord
from schemas.errors import ConfigurationError
from schemas.fingerprint import canonical_json
from schemas.names import Topic

log = logging.getLogger("ratifier.policies")


def local_policies(settings: Settings) -> PolicySet:
    """The local policy folder's set (``RATIFIER_POLICIES__DIRECTORY``, default ours), logged."""
    directory = Path(settings.policies.directory or DEFAULT_POLICY_DIR)
    policies = PolicySet.from_directory(directory)
    log.info("local policy folder %s holds policy set %s", directory, policies.version)
    problems = catalog_mismatches(policies, load_catalog(settings.catalog))
    if problems:
        raise ConfigurationError(
            f"policy set {directory} does not fit catalog {settings.catalog}: "
            + "; ".join(problems)
            + " (regenerate the schema: ratifier policy schema)"
        )
    return policies


def policy_record(settings: Settings, policies: PolicySet) -> PolicySetRecord:
    return PolicySetRecord(
        name=settings.policies.set_name,
        policies=policies.text,
        cedar_schema=json.loads(policies.schema),
        version=policies.version,
        published_at=datetime.now(UTC),
        budgets=tuple(b.document() for b in policies.budgets) or None,
        # Without limits the field is left out: older workers keep reading the record.
        limits=None if policies.limits.empty else policies.limits.model_dump(mode="json"),
    )


def _policies_bytes(record: PolicySetRecord) -> bytes:
    """A set without limits is published without the field: workers of v1.4 keep reading it
    during a rolling upgrade (their record model forbids unknown keys)."""
    if record.limits is None:
        return record.model_dump_json(exclude={"limits"}).encode()
    return record.to_bytes()


async def publish_policies(settings: Settings, record: PolicySetRecord) -> None:
    producer = kafka_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topic(Topic.POLICIES), key=record.name.encode(), value=_policies_bytes(record)
        )
    finally:
        await producer.stop()


@dataclass(frozen=True, kw_only=True)
class Refusal:
    version: str
    reason: str
    at: datetime


@dataclass(frozen=True, kw_only=True)
class PolicyStatus:
    name: str
    in_force: str
    origin: str
    local: str
    local_dir: str
    refusals: tuple[Refusal, ...]

    @property
    def differs(self) -> bool:
        return self.in_force != self.local

    def render(self) -> str:
        lines = [
            f"policy set {self.name!r} in force: {self.in_force}",
            f"  from: {self.origin}",
            f"  local folder {self.local_dir}: {self.local}"
            + ("  ** DIFFERS from the set in force **" if self.differs else " (same)"),
        ]
        lines += [f"  refused: {r.version}: {r.reason}" for r in self.refusals]
        return "\n".join(lines)


async def _require_policies_topic(settings: Settings) -> None:
    """Raise a :class:`ConfigurationError` that says what to do when the `policies` topic does
    not exist (a wrong prefix, or topics never created), rather than waiting for it."""
    name = settings.topic(Topic.POLICIES)
    admin = kafka_admin(settings)
    await start_kafka_client(admin, settings.kafka)
    try:
        exists = name in set(await admin.list_topics())
    finally:
        await admin.close()
    if not exists:
        raise ConfigurationError(
            f"no topic {name} on {settings.kafka.bootstrap}: nothing was ever published under "
            f"the prefix {settings.topic_prefix!r} (check RATIFIER_TOPIC_PREFIX, or create the "
            "topics with `ratifier topics`)"
        )


async def policy_status(settings: Settings) -> PolicyStatus:
    """What a running deployment enforces: the newest valid set on the `policies` topic (the
    one every worker switched to), compared with the local folder."""
    await _require_policies_topic(settings)
    feed = PolicyFeed(settings, local_policies(settings))
    await feed.catch_up(announce=False)
    return PolicyStatus(
        name=settings.policies.set_name,
        in_force=feed.current.version,
        origin=feed.origin,
        local=feed.local_version,
        local_dir=str(settings.policies.directory or DEFAULT_POLICY_DIR),
        refusals=tuple(feed.refusals),
    )


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
        self.local_version = initial.version
        # Where the set in force came from, for the start-up line and `policy status`.
        self.origin = f"local folder {settings.policies.directory or DEFAULT_POLICY_DIR}"

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
        if record.name != self._settings.policies.set_name:
            return
        if record.version == self._current.version:
            # The set in force is the published one, even when the folder holds the same.
            self.origin = self._published(record)
            return
        try:
            budgets = parse_budgets(record.budgets or (), source=f"budgets of {record.version}")
            limits = (
                NO_LIMITS
                if record.limits is None
                else parse_limits(record.limits, source=f"limits of {record.version}")
            )
            candidate = PolicySet.from_sources(
                record.policies, canonical_json(record.cedar_schema), budgets, limits=limits
            )
        except ConfigurationError as exc:
            self._refuse(record.version, exc.safe_message)
            return
        if candidate.version != record.version:
            self._refuse(record.version, f"content hashes to {candidate.version}")
            return
        previous, self._current = self._current, candidate
        self.origin = self._published(record)
        log.warning("policy set switched from %s to %s", previous.version, candidate.version)
        if self._on_change is not None:
            self._on_change(candidate)

    def _published(self, record: PolicySetRecord) -> str:
        return (
            f"topic {self._settings.topic(Topic.POLICIES)} key {record.name!r}, "
            f"published {record.published_at.isoformat()}"
        )

    def _refuse(self, version: str, reason: str) -> None:
        self.refusals.append(Refusal(version=version, reason=reason, at=datetime.now(UTC)))
        log.error("REFUSED policy set %s: %s; keeping %s", version, reason, self._current.version)

    async def catch_up(self, *, announce: bool = True) -> None:
        """Read the topic to its current end, so a starting process uses the newest set. The
        consumer is closed afterwards (start-up may run in another event loop than the
        process's); :meth:`follow` resumes where this stopped."""
        try:
            await self._reader.catch_up()
        finally:
            await self._reader.close()
        if announce:
            self.announce()

    def announce(self) -> None:
        """Say which set is in force and where it came from; a local folder that differs
        from it is reported loudly (and stops start-up with
        RATIFIER_POLICIES__DIRECTORY_MISMATCH=error): editing the folder and restarting does
        not replace a published set."""
        log.warning(
            "policy set in force: %s %s, from %s",
            self._settings.policies.set_name,
            self._current.version,
            self.origin,
        )
        if self.local_version == self._current.version:
            return
        message = (
            f"LOCAL POLICY FOLDER DIFFERS from the set in force: the folder holds "
            f"{self.local_version}, the published set {self._current.version} is used. "
            "Publish the folder (`ratifier policy publish`) to enforce it."
        )
        if self._settings.policies.directory_mismatch == "error":
            raise ConfigurationError(message)
        log.error("%s", message)

    async def follow(self, stop: asyncio.Event | None = None) -> None:
        """Apply every new record until cancelled (or ``stop`` is set)."""
        await self._reader.follow(stop=stop)
