"""The one definition of "pending" shared by the CLI, the HTTP API and the dashboard."""

from __future__ import annotations

from datetime import datetime

from schemas.envelopes import TERMINAL_STATUSES, ApprovalRequest

# An outcome with one of these statuses ends its call's approval request (as sent on the wire).
TERMINAL_STATUS_VALUES = frozenset(s.value for s in TERMINAL_STATUSES)


def is_pending(
    request: ApprovalRequest, *, now: datetime, tenant: str | None, ended: bool = False
) -> bool:
    """A request still waiting for a human: of ``tenant`` (any when None), without a terminal
    outcome for its call, not expired."""
    return not ended and (tenant is None or request.tenant == tenant) and request.expires_at > now


def pending_order(request: ApprovalRequest) -> tuple[datetime, str]:
    """Soonest to expire first."""
    return request.expires_at, request.call_id
