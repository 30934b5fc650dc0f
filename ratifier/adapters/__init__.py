"""Deprecated: the framework adapters moved to ``ratifier_client.adapters`` (distribution
``ratifier-client``).

``ratifier.adapters`` and its modules (``confirmation``, ``langgraph``, ``openai_agents``)
re-export their ``ratifier_client.adapters`` namesakes for one minor version: each warns at
import and goes away in 0.3. docs/upgrading.md lists this and every other change since the
previous release.
"""

from __future__ import annotations

import warnings

warnings.warn(
    "ratifier.adapters is deprecated and will be removed in 0.3: "
    "import from ratifier_client.adapters",
    DeprecationWarning,
    stacklevel=2,
)
