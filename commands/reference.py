"""The default catalog (``RATIFIER_CATALOG=commands.reference:catalog``)."""

from __future__ import annotations

from commands.catalog import Catalog
from commands.payments import TOOLS

catalog = Catalog(TOOLS)
