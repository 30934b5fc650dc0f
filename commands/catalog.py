"""Declaring tools: one `Tool` per catalog name, with its strict argument model, effect
class, resource loader, handler and optional reconcile hook."""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from config.settings import BreakerThresholds, Settings
from schemas.envelopes import Actor, Effect
from schemas.errors import ConfigurationError

Connection = AsyncConnection[DictRow]


SECRET_MARK = "x-secret"  # noqa: S105 - a schema keyword, not a credential


def Secret(**field_options: Any) -> Any:  # noqa: N802 - reads like a type in a model
    """A field whose value is masked wherever it is shown or logged: previews, audit, logs."""
    extra: dict[str, JsonValue] = {SECRET_MARK: True}
    return Field(json_schema_extra=extra, **field_options)


class ToolArguments(BaseModel):
    """Base of every tool's argument model: strict types (no coercion), unknown keys
    forbidden, immutable. Subclasses add explicit bounds, patterns and lengths."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ResourceFacts(BaseModel):
    """Declares what a tool's loader hands to the policies: the resource ``kind`` (its Cedar
    entity type is the kind in CamelCase) and the attributes, as typed fields. The Cedar
    schema is generated from these declarations (`commands.cedar_schema`), so policies are
    checked against what loaders really return. ``tenant`` is always added; do not declare
    it. Attributes may be stored columns or facts the loader computes from the arguments, the
    rows and the actor (``owned_by_caller``, ``days_since_purchase``, ...): the executor's
    commit-time re-check calls the loader again, so computed facts are re-evaluated on the
    locked, current state.

    ``owner_attribute`` names the attribute that says whom the resource belongs to (a
    customer id or e-mail): that subject may confirm a call on it themselves
    (docs/approvals.md, "End-user confirmation"). It must be a declared ``str`` attribute."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    kind: ClassVar[str]
    owner_attribute: ClassVar[str | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        owner = cls.owner_attribute
        if owner is None:
            return
        declared = cls.model_fields.get(owner)
        if declared is None or declared.annotation not in (str, str | None):
            raise ConfigurationError(
                f"{cls.__name__}.owner_attribute is {owner!r}, "
                "which is not a str attribute it declares"
            )

    @classmethod
    def resource(cls, *, id: str, tenant: str, **attributes: Any) -> Resource:
        """A `Resource` of this kind whose attributes are checked against the declaration
        (an undeclared, missing or mistyped attribute raises ``ValidationError``)."""
        facts = cls.model_validate(attributes)
        return Resource(kind=cls.kind, id=id, tenant=tenant, attributes=facts.model_dump())


class Resource(BaseModel):
    """The entity a call acts on, loaded with the tenant in the query's WHERE."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    id: str
    tenant: str
    attributes: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class HandlerResult:
    result: dict[str, Any]
    resource_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExecutionContext:
    """What a handler gets: it runs inside the executor's ledger transaction on ``conn``."""

    conn: Connection
    operation_id: str
    tenant: str
    actor: Actor
    arguments: ToolArguments
    resource: Resource | None


# ``(conn, actor, arguments, for_update)``: the actor (tenant, user, roles, all verified) lets
# a loader decide ownership at load time, so that another user's row answers `not_found`
# exactly like a missing one. Every query still carries ``actor.tenant`` in its WHERE.
ResourceLoader = Callable[[Connection, Actor, Any, bool], Awaitable[Resource | None]]
# ``(conn, tenant, [(actor, arguments), ...])``: what ``load`` would return for each of many
# reads of one tenant, in their order, from one query with ``tenant`` in its WHERE (e.g.
# ``id = ANY(%(ids)s)``). Reads lock nothing: it is called with ``for_update`` false in mind.
BatchLoader = Callable[
    [Connection, str, Sequence[tuple[Actor, Any]]], Awaitable[Sequence[Resource | None]]
]
Handler = Callable[[ExecutionContext], Awaitable[HandlerResult]]


@dataclass(frozen=True, kw_only=True)
class EffectRequest:
    """An external effect to perform (or ask about): the operation id is the downstream
    idempotency key; ``payload`` is what the tool's handler prepared in the ledger's
    transaction (kept in the ledger, so a restart or the reconciler can pick it up)."""

    operation_id: str
    tenant: str
    payload: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ExternalEffect:
    """A tool whose effect happens in another system.

    The tool's ``handler`` prepares it inside the ledger transaction (internal reservations;
    returns the payload). ``invoke`` sends it, outside any transaction, and raises
    `TransientFailure` (known not applied: retried within a budget), `PermanentFailure` (known
    not applied: released) or `OutcomeUnknown` (maybe applied: never retried blindly).
    ``settle`` or ``release`` finish it in a second transaction. ``lookup`` asks the
    downstream system by operation id: the reconcile hook."""

    invoke: Callable[[EffectRequest], Awaitable[HandlerResult]]
    settle: Callable[[Connection, EffectRequest, HandlerResult], Awaitable[None]]
    release: Callable[[Connection, EffectRequest], Awaitable[None]]
    lookup: Callable[[EffectRequest], Awaitable[HandlerResult | None]]


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str
    description: str
    arguments: type[ToolArguments]
    effect: Effect
    handler: Handler
    load: ResourceLoader | None = None
    # ``load`` for many calls of one tenant, in one query (`load_resources`): the authorizer
    # loads the resources of a batch's calls with it, the executor those of a poll batch's
    # plain reads (docs/execution.md, "Reads"); a tool without it is loaded by ``load``, call
    # by call, on the batch's connection.
    load_many: BatchLoader | None = None
    # What ``load`` returns (kind and attributes); required for a generated Cedar schema.
    resource: type[ResourceFacts] | None = None
    external: ExternalEffect | None = None
    secret_fields: frozenset[str] = field(default_factory=frozenset)
    # How long an approval request waits (None: the RATIFIER_APPROVALS__TTL_SECONDS default),
    # and whether the requester may approve their own call.
    approval_ttl: timedelta | None = None
    allow_self_approval: bool = False
    # The downstream system its effect (or read) depends on, judged by that downstream's
    # circuit breaker (docs/execution.md, "Circuit breakers"); None: the catalog's
    # ``provider`` for a tool with an external effect, no breaker otherwise. A tool may name
    # its own (e.g. ``"payments.refunds"``) and declare its own ``breaker`` thresholds.
    downstream: str | None = None
    breaker: BreakerThresholds | None = None

    def __post_init__(self) -> None:
        marked = {
            name
            for name, info in self.arguments.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(SECRET_MARK)
        }
        # Frozen: the union is computed once, at declaration.
        object.__setattr__(self, "secret_fields", frozenset(self.secret_fields | marked))

    def masked(self, arguments: dict[str, Any], *, salt: str | None = None) -> dict[str, Any]:
        """``arguments`` with secret fields replaced: by a salted hash (comparable across
        records, not reversible) when a salt is given, else by ``"***"``."""
        return {
            key: (_mask(value, salt) if key in self.secret_fields else value)
            for key, value in arguments.items()
        }


def load_groups(keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[int]]:
    """The positions of the calls loaded by one query: per ``(tenant, tool)``, in order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return groups


async def load_resources(
    conn: Connection, asks: Sequence[tuple[Tool, Actor, Any]]
) -> list[Resource | None]:
    """The resources of many calls, in order, read-only and locking nothing: one query per
    tenant and tool where the tool has ``load_many``, else one per call (each in its tenant);
    ``None`` for a tool without a loader. The authorizer loads a batch's resources so, the
    executor a poll batch's plain reads."""
    resources: list[Resource | None] = [None] * len(asks)
    keys = [(actor.tenant, tool.name) for tool, actor, _ in asks]
    for (tenant, _), indexes in load_groups(keys).items():
        tool = asks[indexes[0]][0]
        asked = [(asks[i][1], asks[i][2]) for i in indexes]
        if tool.load_many is not None:
            found = list(await tool.load_many(conn, tenant, asked))
        elif tool.load is not None:
            found = [await tool.load(conn, actor, arguments, False) for actor, arguments in asked]
        else:
            continue
        for index, resource in zip(indexes, found, strict=True):
            resources[index] = resource
    return resources


def salted_hash(value: Any, salt: str) -> str:
    """The masked form of a secret value: comparable across records, not reversible."""
    return _mask(value, salt)


def _mask(value: Any, salt: str | None) -> str:
    if salt is None:
        return "***"
    digest = hashlib.sha256(f"{salt}:{value!r}".encode()).hexdigest()[:16]
    return f"sha256:{digest}"


Lifecycle = Callable[[Settings], Awaitable[None]]
_CATALOG_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class Catalog:
    """An immutable set of tools, looked up by exact name (no case folding, no fuzzing).
    ``start``/``stop`` open and close what the tools' effects need (clients, pools)."""

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        start: Lifecycle | None = None,
        stop: Callable[[], Awaitable[None]] | None = None,
        name: str | None = None,
        migrations: Path | None = None,
        approver_policies: Path | None = None,
        reference_approver_policies: bool = True,
        provider: str | None = None,
    ) -> None:
        self._start = start
        # The downstream its tools' external effects go to, unless a tool names another:
        # the name of their shared circuit breaker (`downstream_of`).
        self.provider = provider
        self._stop = stop
        # The catalog's own tables: plain-SQL files applied by `ratifier migrate` after ours,
        # in file-name order, recorded as ``<name>/<file stem>``.
        if migrations is not None and not (name and _CATALOG_NAME.match(name)):
            raise ConfigurationError("a catalog with migrations needs a name like 'helpdesk'")
        self.name = name
        self.migrations = migrations
        # The catalog's approver rules (who may approve, reject or edit its tools' calls, how
        # many must): a folder of *.cedar files over ratifier's approver schema, loaded by
        # the approval-join with ratifier's reference set (approvals/policies), or instead of
        # it when ``reference_approver_policies`` is false (docs/approvals.md).
        self.approver_policies = approver_policies
        self.reference_approver_policies = reference_approver_policies
        if not reference_approver_policies and approver_policies is None:
            raise ConfigurationError(
                "a catalog that replaces the reference approver policies must ship its own"
            )
        by_name: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ConfigurationError(f"tool {tool.name!r} is declared twice")
            by_name[tool.name] = tool
        self._tools: Mapping[str, Tool] = by_name

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    async def start(self, settings: Settings) -> None:
        if self._start is not None:
            await self._start(settings)

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()


def downstream_of(catalog: Catalog, tool: Tool) -> str | None:
    """The downstream whose circuit breaker judges ``tool``'s calls: its own, else the
    catalog's provider for an external effect; None: no breaker."""
    if tool.downstream is not None:
        return tool.downstream
    return catalog.provider if tool.external is not None else None


def load_catalog(spec: str) -> Catalog:
    """Load ``package.module:attribute`` (the ``RATIFIER_CATALOG`` setting)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"catalog must look like 'package.module:name', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"catalog module {module_name!r} cannot be imported") from exc
    catalog = getattr(module, attribute, None)
    if not isinstance(catalog, Catalog):
        raise ConfigurationError(f"{spec!r} is not a ratifier Catalog")
    return catalog
