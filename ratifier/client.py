"""Deprecated: the agent client moved to the ``ratifier-client`` distribution.

``ratifier.client`` re-exports `ratifier_client.client` for one minor version: it warns at
import and goes away in 0.3. Import from ``ratifier_client.client`` (or ``ratifier_client``)
instead; docs/upgrading.md lists this and every other change since the previous release.
"""

from __future__ import annotations

import warnings

from ratifier_client.client import (
    DEFAULT_WAIT_SECONDS,
    PUBLISH_ATTEMPTS,
    PUBLISH_BACKOFF_SECONDS,
    AwaitingApproval,
    CallHandle,
    Pending,
    ProposedToolCall,
    RatifierClient,
    SyncRatifierClient,
    T,
    idempotency_key_for,
    log,
)

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "PUBLISH_ATTEMPTS",
    "PUBLISH_BACKOFF_SECONDS",
    "AwaitingApproval",
    "CallHandle",
    "Pending",
    "ProposedToolCall",
    "RatifierClient",
    "SyncRatifierClient",
    "T",
    "idempotency_key_for",
    "log",
]

# stacklevel 2 names the module that imported this one (the import machinery's own frames
# are skipped), so the warning points at the line to change.
warnings.warn(
    "ratifier.client is deprecated and will be removed in 0.3: "
    "import from ratifier_client.client (or ratifier_client)",
    DeprecationWarning,
    stacklevel=2,
)
