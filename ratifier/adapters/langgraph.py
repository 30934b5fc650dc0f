"""Deprecated: import from ``ratifier_client.adapters.langgraph``; this module re-exports it
until 0.3 (docs/upgrading.md). It needs LangGraph, as before (extra ``[langgraph]`` of
``ratifier-client``)."""

from __future__ import annotations

import warnings

from ratifier_client.adapters.langgraph import (
    ContextSource,
    RatifierToolNode,
    approval_payload,
)

__all__ = ["ContextSource", "RatifierToolNode", "approval_payload"]

warnings.warn(
    "ratifier.adapters.langgraph is deprecated and will be removed in 0.3: "
    "import from ratifier_client.adapters.langgraph",
    DeprecationWarning,
    stacklevel=2,
)
