"""The default catalog (``RATIFIER_CATALOG=commands.reference:catalog``)."""

from __future__ import annotations

from commands.catalog import Catalog
from commands.payments import TOOLS, start_payments, stop_payments

catalog = Catalog(TOOLS, start=start_payments, stop=stop_payments)
