"""No secret argument at rest in the approval-join's table (the audit's rule: a payout
account's number is in no row of any table, tests/e2e/test_audit.py).

A state is stored with the secret fields (`Tool.secret_fields`) of its calls masked, and
with, for each such call, where its record with the real arguments is on Kafka
(streams/join_store.py's ``Source``); before the join uses a state read back, those calls
are read again from there (:class:`SourceReader`) and put back. Kafka keeps them as long as
the topic's retention, which must outlast an approval's TTL (docs/approvals.md). A record
that is no longer there, or not the same call, stops the use of that state
(:class:`SecretsUnavailable`): a command is never built from masked arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from commands.catalog import Catalog
from config.settings import Settings
from runtime.clients import kafka_consumer, start_kafka_client
from schemas.envelopes import AuthorizedCall
from schemas.errors import RatifierError
from streams.approval import ApprovalState
from streams.join_store import Source, Sources

# How long reading one record back may take.
READ_TIMEOUT_MS = 10_000


class SecretsUnavailable(RatifierError):
    """A stored state's secret arguments cannot be read back from Kafka."""


def secret_calls(state: ApprovalState, catalog: Catalog) -> list[AuthorizedCall]:
    """The calls of ``state`` (its own and those that joined it) with secret arguments."""
    calls = [state.authorized] if state.authorized is not None else []
    calls += list(state.followers)
    return [c for c in calls if _secrets(c, catalog)]


def _secrets(call: AuthorizedCall, catalog: Catalog) -> frozenset[str]:
    tool = catalog.get(call.tool)
    return tool.secret_fields & call.arguments.keys() if tool is not None else frozenset()


def _masked(call: AuthorizedCall, catalog: Catalog) -> AuthorizedCall:
    tool = catalog.get(call.tool)
    if tool is None or not _secrets(call, catalog):
        return call
    return call.model_copy(update={"arguments": tool.masked(call.arguments)})


def at_rest(state: ApprovalState, catalog: Catalog) -> ApprovalState:
    """``state`` as stored: its calls' secret fields masked."""
    if not secret_calls(state, catalog):
        return state
    return state.model_copy(
        update={
            "authorized": _masked(state.authorized, catalog) if state.authorized else None,
            "followers": tuple(_masked(f, catalog) for f in state.followers),
        }
    )


def kept_sources(
    state: ApprovalState | None, catalog: Catalog, known: Mapping[str, Source]
) -> dict[str, Source]:
    """Where the secret arguments of ``state``'s calls are (of ``known``), to store with it."""
    if state is None:
        return {}
    return {c.call_id: known[c.call_id] for c in secret_calls(state, catalog) if c.call_id in known}


def restored(state: ApprovalState, real: Mapping[str, AuthorizedCall]) -> ApprovalState:
    """``state`` with its calls replaced by ``real`` ones (read back, by call id)."""
    leader = state.authorized
    return state.model_copy(
        update={
            "authorized": real.get(leader.call_id, leader) if leader is not None else None,
            "followers": tuple(real.get(f.call_id, f) for f in state.followers),
        }
    )


def call_in(raw: bytes | None, source: Source, call_id: str) -> AuthorizedCall | None:
    """The call ``call_id`` in a record read back from ``source``."""
    try:
        if source.kind == "call":
            call = AuthorizedCall.model_validate_json(raw or b"")
            return call if call.call_id == call_id else None
        state = ApprovalState.model_validate_json(raw or b"")
    except ValidationError:
        return None
    calls = [state.authorized] if state.authorized is not None else []
    return next((c for c in [*calls, *state.followers] if c.call_id == call_id), None)


class SourceReader:
    """Reads single records back by position (a group-less consumer, opened on first use)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumer: AIOKafkaConsumer | None = None

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = kafka_consumer(self._settings, group=None)
            await start_kafka_client(consumer, self._settings.kafka)
            self._consumer = consumer
        return self._consumer

    async def read(self, source: Source) -> bytes | None:
        """The value of the record at ``source``; None if it is not there any more."""
        consumer = await self._started()
        tp = TopicPartition(source.topic, source.partition)
        consumer.assign([tp])
        consumer.seek(tp, source.offset)
        got = await consumer.getmany(tp, timeout_ms=READ_TIMEOUT_MS, max_records=1)
        records = got.get(tp) or []
        if not records or records[0].offset != source.offset:
            return None
        value: bytes | None = records[0].value
        return value

    async def restore(
        self, state: ApprovalState, sources: Sources, catalog: Catalog
    ) -> ApprovalState:
        """``state`` (as stored) with its calls' secret arguments read back."""
        real: dict[str, AuthorizedCall] = {}
        for call in secret_calls(state, catalog):
            source = sources.get(call.call_id)
            if source is None:
                raise SecretsUnavailable(f"no record of {call.call_id}'s arguments is known")
            found = call_in(await self.read(source), source, call.call_id)
            if found is None or found.fingerprint != call.fingerprint:
                raise SecretsUnavailable(
                    f"{call.call_id}'s arguments are not at {source.topic}:{source.partition}"
                    f":{source.offset} any more"
                )
            real[call.call_id] = found
        return restored(state, real)

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
