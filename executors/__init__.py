"""The executor service: dedup, command ledger, commit-time re-check, invocation.
Never imports streams."""

from __future__ import annotations
