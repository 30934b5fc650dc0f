"""A test kit for catalog authors: run a proposed call through validate → authorize →
approval route offline (no Kafka, no services), with the catalog, the policy folder and
loader fixtures, and see what the pipeline would answer and why.

    from ratifier.testing import Kit, kit_fixture

    kit = kit_fixture("examples.helpdesk:catalog", "examples/helpdesk/policies")

    def test_customers_read_their_own_tickets(kit: Kit) -> None:
        run = kit.call("get_ticket", {"ticket_id": "tkt_1"}, sub="carol", roles=())
        assert run.status == "auto"
        assert run.policies == ("ticket-read-own-tenant",)

The decisions are the pipeline's own pure functions (`commands.validate.validate`,
`commands.policy.authorize`, the approval route), so a kit answer is the authorizer's.
Resources come from, in order: ``resources`` given to the call, the kit's ``loaders``
(fixtures by tool name: ``(actor, arguments) -> Resource | None``), or the tool's own loader
called with ``conn`` (``None`` unless a connection is given: fine for loaders that do not
touch the database).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from approvals.policy import approver_policy_sources, check_approver_policies
from commands.catalog import Catalog, Connection, Resource, Tool, load_catalog
from commands.policy import (
    Decision,
    PolicySet,
    authorize,
    catalog_mismatches,
    check_policy_directory,
)
from commands.validate import Limits, Rejection, validate
from schemas.envelopes import (
    Actor,
    CallFormat,
    ErrorInfo,
    Outcome,
    ProposedCall,
    Route,
    Stage,
    Status,
)
from schemas.errors import ConfigurationError, ErrorCode, RefusalReason
from schemas.providers import result_text

LoaderFixture = Callable[[Actor, Any], Resource | Awaitable[Resource | None] | None]
AUTO = "auto"  # a permitted call that runs without approval (no outcome yet: the executor's)
_NOT_GIVEN: Any = object()


@dataclass(frozen=True, kw_only=True)
class DryRun:
    """What the pipeline would do with one proposed call, and why."""

    tool: str
    actor: Actor
    status: str  # "rejected", "denied", "awaiting_approval" or "auto"
    stage: Stage
    outcome: Outcome | None  # the outcome a model would get (None for "auto")
    decision: Decision | None = None  # the Cedar decision, when authorization ran
    resource: Resource | None = None

    @property
    def error(self) -> ErrorInfo | None:
        return self.outcome.error if self.outcome is not None else None

    @property
    def code(self) -> ErrorCode | None:
        return self.error.code if self.error is not None else None

    @property
    def reason(self) -> RefusalReason | None:
        return self.error.reason if self.error is not None else None

    @property
    def message(self) -> str | None:
        return self.error.message if self.error is not None else None

    @property
    def policies(self) -> tuple[str, ...]:
        """The ``@id``s of the policies that decided (permits or forbids)."""
        return self.decision.policy_ids if self.decision is not None else ()

    @property
    def permitted(self) -> bool:
        return self.status in (AUTO, Status.AWAITING_APPROVAL.value)

    @property
    def model_text(self) -> str:
        """The text a model would read (every provider renders the same)."""
        return result_text(self.outcome) if self.outcome is not None else "(would execute)"

    def explain(self) -> str:
        lines = [f"{self.tool} by {self.actor.tenant}/{self.actor.sub}: {self.status}"]
        if self.code is not None:
            lines.append(f"  code: {self.code.value}")
        if self.reason is not None:
            lines.append(f"  reason: {self.reason.value}")
        if self.policies:
            lines.append(f"  policies: {', '.join(self.policies)}")
        if self.decision is not None and self.decision.errors:
            lines += [f"  cedar: {e}" for e in self.decision.errors]
        if self.error is not None and self.error.fields:
            lines += [f"  field {f.path}: {f.problem}" for f in self.error.fields]
        lines.append(f"  the model reads: {self.model_text}")
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class Kit:
    """A catalog and a policy set, ready to dry-run calls against."""

    catalog: Catalog
    policies: PolicySet
    loaders: Mapping[str, LoaderFixture] = field(default_factory=dict)
    tenant: str = "tenant-a"
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def load(
        cls,
        catalog: Catalog | str,
        policy_dir: Path | str,
        *,
        loaders: Mapping[str, LoaderFixture] | None = None,
        check: bool = True,
    ) -> Kit:
        """``catalog`` (object or ``package.module:name``) with the policies of
        ``policy_dir``; with ``check`` the folder (and the catalog's approver policies) must
        pass `ratifier policy check`."""
        found = load_catalog(catalog) if isinstance(catalog, str) else catalog
        directory = Path(policy_dir)
        if check:
            # The catalog's approver policies (with the reference set) are checked too.
            approvers = check_approver_policies(approver_policy_sources(found))
            problems = check_policy_directory(directory, found) + approvers
            if problems:
                raise ConfigurationError("; ".join(str(p) for p in problems))
        policies = PolicySet.from_directory(directory)
        mismatches = catalog_mismatches(policies, found)
        if check and mismatches:
            raise ConfigurationError("; ".join(mismatches))
        return cls(catalog=found, policies=policies, loaders=dict(loaders or {}))

    def call(
        self,
        tool: str,
        arguments: Any,
        *,
        tenant: str | None = None,
        sub: str = "tester",
        roles: tuple[str, ...] | list[str] = (),
        actor: Actor | None = None,
        resource: Resource | None = _NOT_GIVEN,
        conn: Connection | None = None,
    ) -> DryRun:
        """Dry-run ``tool(arguments)`` for an actor (from its parts or given whole)."""
        return asyncio.run(
            self.acall(
                tool,
                arguments,
                tenant=tenant,
                sub=sub,
                roles=roles,
                actor=actor,
                resource=resource,
                conn=conn,
            )
        )

    def propose(self, call: ProposedCall, actor: Actor, **kwargs: Any) -> DryRun:
        """Dry-run a whole envelope (any ``format``: native, openai, anthropic, mcp)."""
        return asyncio.run(self._run(call, actor, **kwargs))

    async def acall(
        self,
        tool: str,
        arguments: Any,
        *,
        tenant: str | None = None,
        sub: str = "tester",
        roles: tuple[str, ...] | list[str] = (),
        actor: Actor | None = None,
        resource: Resource | None = _NOT_GIVEN,
        conn: Connection | None = None,
    ) -> DryRun:
        """`call` inside a running event loop (async tests)."""
        who = actor or Actor(sub=sub, tenant=tenant or self.tenant, roles=tuple(roles))
        proposal = ProposedCall(
            call_id=f"kit-{uuid.uuid4().hex[:12]}",
            tool=tool,
            arguments=arguments,
            context="offline",
            format=CallFormat.NATIVE,
            proposed_at=datetime.now(UTC),
        )
        return await self._run(proposal, who, resource=resource, conn=conn)

    async def _run(
        self,
        call: ProposedCall,
        actor: Actor,
        *,
        resource: Resource | None = _NOT_GIVEN,
        conn: Connection | None = None,
    ) -> DryRun:
        checked = validate(call, self.catalog, self.limits)
        if isinstance(checked, Rejection):
            error = ErrorInfo.of(checked.code, fields=checked.fields)
            return self._ended(
                checked.tool_name, actor, status=Status.REJECTED, stage=Stage.VALIDATE, error=error
            )
        tool = checked.tool
        if resource is _NOT_GIVEN:
            resource = await self._load(tool, actor, checked.arguments, conn)
        if tool.load is not None and resource is None:
            error = ErrorInfo.of(ErrorCode.NOT_FOUND)
            return self._ended(
                tool.name, actor, status=Status.DENIED, stage=Stage.AUTHORIZE, error=error
            )
        decision = authorize(
            actor=actor,
            tool=tool,
            resource=resource,
            arguments=checked.normalized,
            policies=self.policies,
        )
        refused = decision.error_info()
        if refused is not None:
            run = self._ended(
                tool.name, actor, status=Status.DENIED, stage=Stage.AUTHORIZE, error=refused
            )
            return replace(run, decision=decision, resource=resource)
        if decision.route is Route.APPROVAL:
            # As the approval stage answers while a human decides.
            required = ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED)
            run = self._ended(
                tool.name,
                actor,
                status=Status.AWAITING_APPROVAL,
                stage=Stage.APPROVE,
                error=required,
            )
            return replace(run, decision=decision, resource=resource)
        return DryRun(
            tool=tool.name,
            actor=actor,
            status=AUTO,
            stage=Stage.EXECUTE,
            outcome=None,
            decision=decision,
            resource=resource,
        )

    async def _load(
        self, tool: Tool, actor: Actor, arguments: Any, conn: Connection | None
    ) -> Resource | None:
        fixture = self.loaders.get(tool.name)
        if fixture is not None:
            loaded = fixture(actor, arguments)
            return await loaded if isinstance(loaded, Awaitable) else loaded
        if tool.load is None:
            return None
        return await tool.load(conn, actor, arguments, False)  # type: ignore[arg-type]

    def _ended(
        self, tool: str, actor: Actor, *, status: Status, stage: Stage, error: ErrorInfo
    ) -> DryRun:
        outcome = Outcome.for_call(
            call_id="kit",
            tool=tool,
            tenant=actor.tenant,
            status=status,
            stage=stage,
            error=error,
            policy_version=self.policies.version,
            at=datetime.now(UTC),
        )
        return DryRun(tool=tool, actor=actor, status=status.value, stage=stage, outcome=outcome)


def kit_fixture(
    catalog: Catalog | str,
    policy_dir: Path | str,
    *,
    loaders: Mapping[str, LoaderFixture] | None = None,
    name: str = "kit",
) -> Any:
    """A pytest fixture (module scope) giving a `Kit`; assign it to a module-level name:
    ``kit = kit_fixture("my_plugin:catalog", "my_plugin/policies")``."""
    import pytest  # noqa: PLC0415 - a test dependency; check-call uses the kit without it

    @pytest.fixture(scope="module", name=name)
    def _kit() -> Kit:
        return Kit.load(catalog, policy_dir, loaders=loaders)

    return _kit
