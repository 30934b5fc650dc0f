"""The command catalog, policies and the reference domain. Imports `schemas` only."""

from __future__ import annotations
