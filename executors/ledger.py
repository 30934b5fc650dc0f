"""The command ledger in PostgreSQL: the authority on whether an operation has run.

Written in the same transaction as internal domain effects, so an empty Redis can never
cause a second effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from commands.catalog import Connection
from commands.sql import named_query
from schemas.envelopes import CommittedCommand, Outcome
from schemas.vocabulary import AuditKind, LedgerStatus

_PKG = __name__.rpartition(".")[0]


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    operation_id: str
    call_id: str
    fingerprint: str
    status: LedgerStatus
    fencing: int
    outcome: Outcome | None
    effect: dict[str, Any] | None


class CommandLedger:
    """Ledger operations on a connection inside the caller's transaction."""

    @staticmethod
    def _key(command: CommittedCommand) -> dict[str, Any]:
        return {"tenant": command.tenant, "idempotency_key": command.idempotency_key}

    async def group_lock_timeout(self, conn: Connection) -> None:
        """Bound the waits for row locks in a group commit's transaction."""
        await conn.execute(named_query(_PKG, "group_lock_timeout"))

    async def claim(self, conn: Connection, command: CommittedCommand, fencing: int) -> bool:
        """Insert the running entry; False when the key is already in the ledger."""
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "claim_operation"),
                {
                    **self._key(command),
                    "operation_id": command.operation_id,
                    "call_id": command.call_id,
                    "tool": command.tool,
                    "fingerprint": command.fingerprint,
                    "fencing": fencing,
                },
            )
            return await cur.fetchone() is not None

    async def entry_for_update(
        self, conn: Connection, command: CommittedCommand
    ) -> LedgerEntry | None:
        async with conn.cursor() as cur:
            await cur.execute(named_query(_PKG, "ledger_entry_for_update"), self._key(command))
            row = await cur.fetchone()
        if row is None:
            return None
        stored = row["outcome"]
        return LedgerEntry(
            operation_id=row["operation_id"],
            call_id=row["call_id"],
            fingerprint=row["fingerprint"],
            status=LedgerStatus(row["status"]),
            fencing=row["fencing"],
            outcome=Outcome.model_validate(stored) if stored is not None else None,
            effect=row["effect"],
        )

    async def record(self, conn: Connection, command: CommittedCommand, outcome: Outcome) -> None:
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "record_outcome"),
                {
                    **self._key(command),
                    "status": outcome.status.value,
                    "outcome": Jsonb(outcome.model_dump(mode="json")),
                },
            )

    async def mark_effect_pending(
        self,
        conn: Connection,
        command: CommittedCommand,
        *,
        fencing: int,
        effect: dict[str, Any],
    ) -> None:
        """The effect is prepared and about to be sent: from now on only the downstream
        system's own record can say whether it happened."""
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "mark_effect_pending"),
                {**self._key(command), "fencing": fencing, "effect": Jsonb(effect)},
            )

    async def finish_effect(
        self, conn: Connection, command: CommittedCommand, *, fencing: int, outcome: Outcome
    ) -> bool:
        """Record the effect's outcome if the entry is still ours and still pending; False
        when someone else (the reconciler, a later owner) already settled it."""
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "finish_effect"),
                {
                    **self._key(command),
                    "fencing": fencing,
                    "status": outcome.status.value,
                    "outcome": Jsonb(outcome.model_dump(mode="json")),
                },
            )
            return await cur.fetchone() is not None

    async def mark_unknown(
        self, conn: Connection, command: CommittedCommand, *, fencing: int, outcome: Outcome
    ) -> bool:
        """Take over an effect left pending by an owner that is gone or too slow: from now
        on only reconciliation settles it (the old owner's late result is refused by its
        stale fencing number). False when the entry moved on meanwhile."""
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "mark_unknown"),
                {
                    **self._key(command),
                    "fencing": fencing,
                    "outcome": Jsonb(outcome.model_dump(mode="json")),
                },
            )
            return await cur.fetchone() is not None

    async def await_settlement(
        self, conn: Connection, command: CommittedCommand, *, trace_id: str | None
    ) -> None:
        """Record that this call was answered `unknown` for its operation, in the transaction
        that answers it (the entry locked): reconciliation owes it the settled outcome."""
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "await_settlement"),
                {
                    **self._key(command),
                    "call_id": command.call_id,
                    "trace_id": trace_id,
                    "reply_to": Jsonb(command.reply_to.model_dump(mode="json"))
                    if command.reply_to is not None
                    else None,
                },
            )

    async def audit(
        self,
        conn: Connection,
        *,
        tenant: str | None,
        call_id: str | None,
        kind: AuditKind,
        detail: dict[str, Any],
    ) -> None:
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "insert_audit"),
                {"tenant": tenant, "call_id": call_id, "kind": kind.value, "detail": Jsonb(detail)},
            )

    async def audit_many(
        self,
        conn: Connection,
        rows: Sequence[tuple[str | None, str | None, dict[str, Any]]],
        *,
        kind: AuditKind,
    ) -> None:
        """`audit` for many calls in one statement: ``(tenant, call_id, detail)`` each."""
        if not rows:
            return
        async with conn.cursor() as cur:
            await cur.execute(
                named_query(_PKG, "insert_audit_many"),
                {
                    "kind": kind.value,
                    "rows": Jsonb(
                        [
                            {"tenant": tenant, "call_id": call_id, "detail": detail}
                            for tenant, call_id, detail in rows
                        ]
                    ),
                },
            )
