"""The default catalog (``RATIFIER_CATALOG=commands.reference:catalog``)."""

from __future__ import annotations

from pathlib import Path

from commands.catalog import Catalog
from commands.payments import TOOLS, start_payments, stop_payments

# The reference domain's seed data lives with it (commands/payments/migrations), so only a
# deployment of the reference catalog gets it.
catalog = Catalog(
    TOOLS,
    start=start_payments,
    stop=stop_payments,
    name="payments",
    migrations=Path(__file__).parent / "payments" / "migrations",
)
