"""Deprecated: import from ``ratifier_client.adapters.openai_agents``; this module re-exports
it until 0.3 (docs/upgrading.md). It needs the OpenAI Agents SDK, as before (extra
``[openai-agents]`` of ``ratifier-client``)."""

from __future__ import annotations

import warnings

from ratifier_client.adapters.openai_agents import (
    ContextSource,
    RatifierAgentTools,
    ToolDefinition,
    pending_text,
    tool_definitions,
)

__all__ = [
    "ContextSource",
    "RatifierAgentTools",
    "ToolDefinition",
    "pending_text",
    "tool_definitions",
]

warnings.warn(
    "ratifier.adapters.openai_agents is deprecated and will be removed in 0.3: "
    "import from ratifier_client.adapters.openai_agents",
    DeprecationWarning,
    stacklevel=2,
)
