"""Deprecated: import from ``ratifier_client.adapters.confirmation``; this module re-exports
it until 0.3 (docs/upgrading.md)."""

from __future__ import annotations

import warnings

from ratifier_client.adapters.confirmation import ConfirmationApi, ConfirmationRefused

__all__ = ["ConfirmationApi", "ConfirmationRefused"]

warnings.warn(
    "ratifier.adapters.confirmation is deprecated and will be removed in 0.3: "
    "import from ratifier_client.adapters.confirmation",
    DeprecationWarning,
    stacklevel=2,
)
