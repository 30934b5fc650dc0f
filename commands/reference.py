"""The default catalog (``RATIFIER_CATALOG=commands.reference:catalog``): the reference
domain, commands/payments."""

from __future__ import annotations

from commands.payments.tools import catalog

__all__ = ["catalog"]
